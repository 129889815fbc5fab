//! The server's side of a run: scrape the target's Prometheus `/metrics` (and any
//! `--server-metrics` endpoint) before, during and after the load, and summarise a window
//! of it (the run, a sweep level, a capacity probe) for the report's `server` key.
//!
//! The API is three calls:
//! - [`Scraper::start`]`(endpoints, interval, &client)` spawns one tokio task that probes
//!   every endpoint at once, then scrapes those that answered Prometheus text every
//!   `interval`; it never blocks the caller.
//! - [`Scraper::finish`]`().await` scrapes each endpoint once more, stops the task and
//!   returns the [`ScrapeLog`].
//! - [`ScrapeLog::section`]`(from, to, run_start)` summarises the window `[from, to]` into
//!   a [`ServerSection`], its timeline on the axis of seconds since `run_start`.
//!
//! An endpoint whose probe fails, or that answers something other than Prometheus text
//! (HTML, JSON, an empty body, an HTTP error), is dropped with a note in the report, never
//! a failure of the run.
//!
//! The text parser is our own (`parse`): `prometheus-parse`, the crate that would fit, reads
//! metric names as `\w+` (every `vllm:` name is lost) and label values by splitting on `,`
//! and `=` (an escaped quote or a comma in a value breaks it), and brings chrono, itertools
//! and regex; the format is a few hundred lines to read right, with property tests.
//!
//! ## What is kept
//! Each scrape is reduced at once to one value per metric *family*: the family's series
//! summed over all their label sets (`FamilyValue`); summaries are skipped (their
//! quantiles cannot be summed, and the report's keys have no place for them); an untyped
//! family reads as a gauge. Scrapes of all endpoints in one round share one instant (when
//! the round's last read returned), and the statistics sum each family across endpoints,
//! an endpoint that failed in a round counting with its previous scrape. Families of
//! TensorRT-LLM whose total means nothing are also kept per label value
//! (`parse::SPLIT_BY_LABEL`).
//!
//! ## The statistics of a window `[from, to]`
//! - gauge → `{type: "gauge", avg, min, max, last}` over the rounds inside the window
//!   (each round weighing the same); when no round is inside, the last round at or before
//!   `from`, so a short window still has a value.
//! - counter → `{type: "counter", delta, rate}`: the increase from the last round at or
//!   before `from` to the first round at or after `to` (so the window's whole load is
//!   inside, exactly: the probe before the load and the final scrape after it bound a run;
//!   a sweep level's bounds may reach into its neighbours' by up to one interval; with no
//!   round on a side, the nearest on the other), a decrease being a reset as in Prometheus'
//!   `increase` (the value
//!   after it counts from zero), per endpoint then summed; `rate` = delta / the seconds
//!   between those two rounds (0 when they are one round). A series that appears during
//!   the window counts from zero.
//! - histogram → `{type: "histogram", count, sum, p50, p90, p99}` from the bucket deltas
//!   between the same two rounds (a drop of `_count` is a reset), quantiles interpolated
//!   linearly within the bucket as Prometheus' `histogram_quantile` does, in the metric's
//!   own unit, except a family of seconds ([`in_seconds`]: its name ends `_seconds`, or it
//!   is a known server's timing family): its `sum` and quantiles are in milliseconds,
//!   `unit: "ms"`, so every time a goal reads is in ms; quantiles are 0 when the window saw
//!   no observation.
//! - timeline: per round inside the window (or the fallback round), the known families'
//!   (`known::KNOWN`) gauge values, their counters' rate since the previous round,
//!   and their histograms' mean observation since the previous round (in ms for a family
//!   of seconds).

mod endpoints;
pub mod gateway;
mod known;
mod mixed;
mod parse;
mod scrape;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

pub use endpoints::{expand_env, prefix_hint};
pub use known::{
    COUNTS_CACHED, Role, in_seconds, known_family, prompt_tokens_meaning, role_of, server_of,
};
pub use scrape::{ScrapeClientOptions, ScrapeEndpoint, Scraper};

use parse::{FamilyValue, add_bucket};

/// The report's `server` key for one window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerSection {
    /// Every endpoint asked for, in order, dropped ones with their note.
    pub endpoints: Vec<ServerEndpoint>,
    /// Family name → its statistics over the window.
    pub metrics: BTreeMap<String, ServerMetric>,
    /// The known families over time, for the plots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<ServerPoint>,
}

/// One scraped endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerEndpoint {
    /// Its URL, credentials redacted.
    pub url: String,
    /// Its successful scrapes from the first round the window's statistics used to the
    /// last (so the probe counts in a run's section).
    pub scrapes: u64,
    /// Its failed scrapes up to the window's end, from its start or from the first round
    /// used, whichever is earlier (from the very first when that round is the probe, so a
    /// dropped endpoint's failed probe counts).
    pub errors: u64,
    /// Why it was dropped (no Prometheus metrics, unreachable...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Set when its series cannot be one server's (counters that went backwards between
    /// scrapes more than once: a load balancer alternating replicas): what was seen. Its
    /// families are then left out of `metrics` and `timeline`, never differenced as one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed: Option<String>,
}

/// One family's statistics over a window (see the module doc for their definitions).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ServerMetric {
    /// A gauge (or untyped family) over the window's rounds.
    Gauge {
        /// Mean of the rounds' values.
        avg: f64,
        /// Least value.
        min: f64,
        /// Greatest value.
        max: f64,
        /// The last round's value.
        last: f64,
    },
    /// A counter's increase.
    Counter {
        /// Increase over the window (resets handled).
        delta: f64,
        /// `delta` per second.
        rate: f64,
    },
    /// A histogram's observations within the window.
    Histogram {
        /// Observations.
        count: f64,
        /// Sum of the observations.
        sum: f64,
        /// Median, in the metric's unit (`unit`).
        p50: f64,
        /// 90th percentile.
        p90: f64,
        /// 99th percentile.
        p99: f64,
        /// `ms` when the family is one of seconds and `sum` and the quantiles were
        /// converted to milliseconds; absent when they are in the family's own unit (every
        /// other histogram, and a seconds family in a report saved before the conversion:
        /// [`ServerMetric::in_ms`] converts those).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unit: Option<ServerUnit>,
        /// The buckets p50, p90 and p99 lie in (the same unit): an interpolated quantile is
        /// known only to within its bucket. Absent in reports saved before they were kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        buckets: Option<[QuantileBucket; 3]>,
    },
}

/// The histogram bucket a quantile lies in: `from` < value ≤ `to`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QuantileBucket {
    /// The bucket's lower bound (the previous bucket's `le`, 0 for the first).
    pub from: f64,
    /// Its upper bound (`le`); `None` for the `+Inf` bucket.
    #[serde(default)]
    pub to: Option<f64>,
}

impl QuantileBucket {
    /// The bucket's width, `None` for the `+Inf` bucket.
    pub fn width(&self) -> Option<f64> {
        self.to.map(|to| to - self.from)
    }

    fn scaled(self, factor: f64) -> QuantileBucket {
        QuantileBucket {
            from: self.from * factor,
            to: self.to.map(|to| to * factor),
        }
    }
}

/// The unit a histogram's statistics were converted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerUnit {
    /// Milliseconds (from a family of seconds).
    #[serde(rename = "ms")]
    Ms,
}

impl ServerMetric {
    /// This metric with every time in milliseconds: a histogram of family `name` measured
    /// in seconds ([`in_seconds`]) whose statistics are still in seconds gets its `sum` and
    /// quantiles × 1000 and `unit: ms`; anything else is returned as it is. Goals and the
    /// report read server histograms through it, so a time is in ms whichever version
    /// wrote the report.
    pub fn in_ms(self, name: &str) -> ServerMetric {
        match self {
            ServerMetric::Histogram {
                count,
                sum,
                p50,
                p90,
                p99,
                unit: None,
                buckets,
            } if in_seconds(name) => ServerMetric::Histogram {
                count,
                sum: sum * MS_PER_SECOND,
                p50: p50 * MS_PER_SECOND,
                p90: p90 * MS_PER_SECOND,
                p99: p99 * MS_PER_SECOND,
                unit: Some(ServerUnit::Ms),
                buckets: buckets.map(|b| b.map(|bucket| bucket.scaled(MS_PER_SECOND))),
            },
            other => other,
        }
    }

    /// True for a histogram whose times are in milliseconds.
    pub fn is_ms(&self) -> bool {
        matches!(
            self,
            ServerMetric::Histogram {
                unit: Some(ServerUnit::Ms),
                ..
            }
        )
    }
}

/// Milliseconds in a second.
const MS_PER_SECOND: f64 = 1_000.0;

/// The known families at one round.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerPoint {
    /// Seconds since the run's start (negative before it).
    pub t_s: f64,
    /// Family → gauge value, counter rate per second, or histogram mean since the
    /// previous round.
    pub values: BTreeMap<String, f64>,
}

/// Everything the scraper saw: per round, each endpoint's families.
#[derive(Debug, Clone, Default)]
pub struct ScrapeLog {
    endpoints: Vec<EndpointLog>,
    rounds: Vec<Round>,
}

/// One endpoint's bookkeeping.
#[derive(Debug, Clone, Default)]
struct EndpointLog {
    /// Redacted URL.
    url: String,
    /// Why it was dropped.
    note: Option<String>,
    /// When its scrapes failed.
    errors: Vec<SystemTime>,
    /// The target's own `/metrics` (its token counters are compared with the run's).
    target: bool,
}

/// One round of scrapes.
#[derive(Debug, Clone)]
struct Round {
    /// When the round's last successful read returned.
    at: SystemTime,
    /// Per endpoint (index as in `ScrapeLog::endpoints`), its families, `None` when it
    /// failed or is dropped.
    values: Vec<Option<Families>>,
    /// Per endpoint, which replica answered as far as its labels say
    /// (`parse::replica_identity`), `None` when they say nothing or it failed.
    replicas: Vec<Option<String>>,
}

/// One scrape, reduced.
type Families = BTreeMap<String, FamilyValue>;

/// A histogram's increase over some rounds.
#[derive(Debug, Clone, Default)]
struct HistogramDelta {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl ScrapeLog {
    /// Summarise the window `[from, to]`; timeline instants are seconds since `run_start`.
    pub fn section(
        &self,
        from: SystemTime,
        to: SystemTime,
        run_start: SystemTime,
    ) -> ServerSection {
        self.section_against(from, to, run_start, None)
    }

    /// As [`ScrapeLog::section`], and with the run's own count of output tokens in the
    /// window (`client_output_tokens`), the target's endpoint is also `mixed` when its
    /// generated-token counters grew far from it ([`mixed::token_mismatch`]).
    pub fn section_against(
        &self,
        from: SystemTime,
        to: SystemTime,
        run_start: SystemTime,
        client_output_tokens: Option<f64>,
    ) -> ServerSection {
        let mut mixed = self.mixed_endpoints(from, to);
        if let Some(client) = client_output_tokens {
            self.check_token_counts(&mut mixed, from, to, client);
        }
        let filled = self.filled(&mixed);
        let window: Vec<usize> = (0..self.rounds.len())
            .filter(|&i| self.rounds[i].at >= from && self.rounds[i].at <= to)
            .collect();
        let gauge_rounds: Vec<usize> = if window.is_empty() {
            (0..self.rounds.len())
                .rev()
                .find(|&i| self.rounds[i].at <= from)
                .into_iter()
                .collect()
        } else {
            window
        };
        let span = match (self.bounding(from, false), self.bounding(to, true)) {
            (Some(start), Some(end)) if start <= end => Some((start, end)),
            (Some(start), Some(_)) => Some((start, start)),
            _ => None,
        };

        let mut used: Vec<usize> = gauge_rounds.clone();
        if let Some((start, end)) = span {
            used.push(start);
            used.push(end);
        }
        let first_used = used.iter().copied().min();
        let last_used = used.iter().copied().max();
        let errors_from = match first_used {
            Some(0) | None => SystemTime::UNIX_EPOCH,
            Some(first) => from.min(self.rounds[first].at),
        };
        // Failures up to the last round used (the scrape after the window's end, whose
        // numbers bound its counters) count as that window's.
        let errors_to = last_used.map_or(to, |last| to.max(self.rounds[last].at));
        let endpoints = self
            .endpoints
            .iter()
            .enumerate()
            .map(|(e, endpoint)| ServerEndpoint {
                url: endpoint.url.clone(),
                scrapes: match (first_used, last_used) {
                    (Some(first), Some(last)) => (first..=last)
                        .filter(|&i| self.rounds[i].values.get(e).is_some_and(Option::is_some))
                        .count() as u64,
                    _ => 0,
                },
                errors: endpoint
                    .errors
                    .iter()
                    .filter(|&&at| at >= errors_from && at <= errors_to)
                    .count() as u64,
                note: endpoint.note.clone(),
                mixed: mixed.get(e).cloned().flatten(),
            })
            .collect();

        // Every family seen in the rounds used, with the kind it was first seen as.
        let mut kinds: BTreeMap<&str, Kind> = BTreeMap::new();
        for &i in &used {
            for families in filled[i].iter().flatten() {
                for (name, value) in families.iter() {
                    kinds.entry(name.as_str()).or_insert(Kind::of(value));
                }
            }
        }

        let mut metrics = BTreeMap::new();
        for (name, kind) in &kinds {
            if let Some(metric) = self.window_metric(&filled, name, *kind, &gauge_rounds, span) {
                metrics.insert((*name).to_owned(), metric);
            }
        }

        let known: Vec<(&str, Kind)> = kinds
            .iter()
            .filter(|(name, _)| role_of(name).is_some())
            .map(|(name, kind)| (*name, *kind))
            .collect();
        let timeline = gauge_rounds
            .iter()
            .map(|&i| self.timeline_point(&filled, &known, i, run_start))
            .collect();

        ServerSection {
            endpoints,
            metrics,
            timeline,
        }
    }

    /// Family `name`'s statistics over the window: a gauge over `gauge_rounds`, a counter
    /// or histogram between the rounds of `span`; a histogram of seconds in ms.
    fn window_metric(
        &self,
        filled: &[Vec<Option<&Families>>],
        name: &str,
        kind: Kind,
        gauge_rounds: &[usize],
        span: Option<(usize, usize)>,
    ) -> Option<ServerMetric> {
        match kind {
            Kind::Gauge => self.gauge_stats(filled, name, gauge_rounds),
            Kind::Counter => span.map(|(start, end)| {
                let delta = counter_increase(filled, name, start, end);
                let seconds = seconds_between(self.rounds[start].at, self.rounds[end].at);
                ServerMetric::Counter {
                    delta,
                    rate: if seconds > 0.0 { delta / seconds } else { 0.0 },
                }
            }),
            Kind::Histogram => span.map(|(start, end)| {
                let delta = histogram_increase(filled, name, start, end);
                ServerMetric::Histogram {
                    count: delta.count,
                    sum: delta.sum,
                    p50: histogram_quantile(0.5, &delta.buckets),
                    p90: histogram_quantile(0.9, &delta.buckets),
                    p99: histogram_quantile(0.99, &delta.buckets),
                    unit: None,
                    buckets: (delta.count > 0.0)
                        .then(|| [0.5, 0.9, 0.99].map(|q| quantile_bucket(q, &delta.buckets))),
                }
                .in_ms(name)
            }),
        }
    }

    /// The `known` families at round `i`: gauge values, counters' rate and histograms'
    /// mean (in ms for a family of seconds) since the previous round.
    fn timeline_point(
        &self,
        filled: &[Vec<Option<&Families>>],
        known: &[(&str, Kind)],
        i: usize,
        run_start: SystemTime,
    ) -> ServerPoint {
        let mut values = BTreeMap::new();
        for &(name, kind) in known {
            let value = match kind {
                Kind::Gauge => gauge_sum(&filled[i], name),
                Kind::Counter if i > 0 => {
                    let seconds = seconds_between(self.rounds[i - 1].at, self.rounds[i].at);
                    (seconds > 0.0).then(|| counter_increase(filled, name, i - 1, i) / seconds)
                }
                Kind::Histogram if i > 0 => {
                    let delta = histogram_increase(filled, name, i - 1, i);
                    let scale = if in_seconds(name) { MS_PER_SECOND } else { 1.0 };
                    (delta.count > 0.0).then(|| scale * delta.sum / delta.count)
                }
                Kind::Counter | Kind::Histogram => None,
            };
            if let Some(value) = value.filter(|value| value.is_finite()) {
                values.insert(name.to_owned(), value);
            }
        }
        ServerPoint {
            t_s: signed_seconds(run_start, self.rounds[i].at),
            values,
        }
    }

    /// Per endpoint, what shows its series cannot be one server's over the rounds that bound
    /// or fall in `[from, to]`: a counter (or a histogram's count) that went backwards
    /// between consecutive scrapes in two intervals or more. One backward step is a restart
    /// (a reset, counted from zero); alternating replicas behind a load balancer step back
    /// about every other scrape.
    fn mixed_endpoints(&self, from: SystemTime, to: SystemTime) -> Vec<Option<String>> {
        let (Some(first), Some(last)) = (self.bounding(from, false), self.bounding(to, true))
        else {
            return vec![None; self.endpoints.len()];
        };
        let (first, last) = (first.min(last), first.max(last));
        (0..self.endpoints.len())
            .map(|e| {
                let scrapes: Vec<&Families> = self.rounds[first..=last]
                    .iter()
                    .filter_map(|round| round.values.get(e).and_then(Option::as_ref))
                    .collect();
                let replicas: Vec<&str> = self.rounds[first..=last]
                    .iter()
                    .filter_map(|round| round.replicas.get(e).and_then(Option::as_deref))
                    .collect();
                mixed_series(&scrapes).or_else(|| mixed::replica_changed(&replicas))
            })
            .collect()
    }

    /// Per round, each endpoint's latest scrape at or before it (carried forward over
    /// failed scrapes).
    /// An endpoint whose series are `mixed` is left out (never `Some`).
    fn filled(&self, mixed: &[Option<String>]) -> Vec<Vec<Option<&Families>>> {
        let mut latest: Vec<Option<&Families>> = vec![None; self.endpoints.len()];
        self.rounds
            .iter()
            .map(|round| {
                for (e, value) in round.values.iter().enumerate() {
                    if mixed.get(e).is_some_and(Option::is_some) {
                        continue;
                    }
                    if let (Some(value), Some(slot)) = (value, latest.get_mut(e)) {
                        *slot = Some(value);
                    }
                }
                latest.clone()
            })
            .collect()
    }

    /// The round that bounds a window at `at`: the first at or after it for a window's end
    /// (`after`), the last at or before it for its start; the nearest on the other side
    /// when there is none.
    fn bounding(&self, at: SystemTime, after: bool) -> Option<usize> {
        let first_after = self.rounds.partition_point(|round| round.at < at);
        let last_before = self
            .rounds
            .partition_point(|round| round.at <= at)
            .checked_sub(1);
        let first_after = (first_after < self.rounds.len()).then_some(first_after);
        if after {
            first_after.or(last_before)
        } else {
            last_before.or(first_after)
        }
    }

    /// A gauge over `rounds`, the rounds where some endpoint has it.
    fn gauge_stats(
        &self,
        filled: &[Vec<Option<&Families>>],
        name: &str,
        rounds: &[usize],
    ) -> Option<ServerMetric> {
        let values: Vec<f64> = rounds
            .iter()
            .filter_map(|&i| gauge_sum(&filled[i], name))
            .collect();
        let last = *values.last()?;
        let count = values.len() as f64;
        Some(ServerMetric::Gauge {
            avg: values.iter().sum::<f64>() / count,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            last,
        })
    }
}

/// The kinds of statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
    Histogram,
}

impl Kind {
    fn of(value: &FamilyValue) -> Kind {
        match value {
            FamilyValue::Gauge(_) => Kind::Gauge,
            FamilyValue::Counter(_) => Kind::Counter,
            FamilyValue::Histogram { .. } => Kind::Histogram,
        }
    }
}

/// What shows that one endpoint's consecutive `scrapes` are not one server's: counters
/// (or histogram counts) that went backwards in two intervals or more; `None` otherwise.
fn mixed_series(scrapes: &[&Families]) -> Option<String> {
    let mut backwards = 0;
    let mut example: Option<(&str, f64, f64)> = None;
    for pair in scrapes.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        let went_back = after.iter().find_map(|(name, value)| {
            let now = monotonic_value(value)?;
            let then = before.get(name).and_then(monotonic_value)?;
            (now < then).then_some((name.as_str(), then, now))
        });
        if let Some(step) = went_back {
            backwards += 1;
            example.get_or_insert(step);
        }
    }
    let (name, then, now) = example?;
    (backwards >= 2).then(|| {
        format!(
            "mixed series: counters went backwards in {backwards} of {} intervals between \
             scrapes ({} from {} to {}): the scrapes reach more than one server (a load \
             balancer in front of replicas?), so this endpoint's numbers are left out, never \
             differenced as one server's; scrape each replica with --server-metrics URL",
            scrapes.len() - 1,
            common::text::escape_controls(name),
            number_text(then),
            number_text(now),
        )
    })
}

/// A counter's value, or a histogram's count: what only grows on one server.
fn monotonic_value(value: &FamilyValue) -> Option<f64> {
    match value {
        FamilyValue::Counter(value) => Some(*value),
        FamilyValue::Histogram { count, .. } => Some(*count),
        FamilyValue::Gauge(_) => None,
    }
}

/// A whole number without decimals, others with two.
fn number_text(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

/// A gauge summed over the endpoints that have it at one round.
fn gauge_sum(endpoints: &[Option<&Families>], name: &str) -> Option<f64> {
    let mut total = None;
    for families in endpoints.iter().flatten() {
        if let Some(FamilyValue::Gauge(value)) = families.get(name) {
            *total.get_or_insert(0.0) += value;
        }
    }
    total
}

/// A counter's increase from round `start` to round `end`, per endpoint (a decrease is a
/// reset, a family absent at `start` starts from zero), summed.
fn counter_increase(
    filled: &[Vec<Option<&Families>>],
    name: &str,
    start: usize,
    end: usize,
) -> f64 {
    let endpoints = filled.get(start).map_or(0, Vec::len);
    let mut total = 0.0;
    for endpoint in 0..endpoints {
        if scraped(filled, start, endpoint).is_none() {
            continue;
        }
        let value_at = |round: usize| match scraped(filled, round, endpoint)
            .and_then(|families| families.get(name))
        {
            Some(FamilyValue::Counter(value)) => Some(*value),
            _ => None,
        };
        let mut previous = value_at(start).unwrap_or(0.0);
        for round in start + 1..=end {
            if let Some(value) = value_at(round) {
                total += if value >= previous {
                    value - previous
                } else {
                    value
                };
                previous = value;
            }
        }
    }
    total
}

/// Endpoint `endpoint`'s families at round `round` (carried forward), if any.
fn scraped<'a>(
    filled: &[Vec<Option<&'a Families>>],
    round: usize,
    endpoint: usize,
) -> Option<&'a Families> {
    filled
        .get(round)
        .and_then(|endpoints| endpoints.get(endpoint).copied().flatten())
}

/// A histogram's increase from round `start` to round `end` (as [`counter_increase`], a
/// drop of `_count` being a reset), summed over endpoints bucket by bucket.
fn histogram_increase(
    filled: &[Vec<Option<&Families>>],
    name: &str,
    start: usize,
    end: usize,
) -> HistogramDelta {
    let endpoints = filled.get(start).map_or(0, Vec::len);
    let mut total = HistogramDelta::default();
    let empty: Vec<(f64, f64)> = Vec::new();
    for endpoint in 0..endpoints {
        if scraped(filled, start, endpoint).is_none() {
            continue;
        }
        let value_at = |round: usize| match scraped(filled, round, endpoint)
            .and_then(|families| families.get(name))
        {
            Some(FamilyValue::Histogram {
                buckets,
                sum,
                count,
            }) => Some((buckets, *sum, *count)),
            _ => None,
        };
        let (mut previous_buckets, mut previous_sum, mut previous_count) =
            value_at(start).unwrap_or((&empty, 0.0, 0.0));
        for round in start + 1..=end {
            let Some((buckets, sum, count)) = value_at(round) else {
                continue;
            };
            let reset = count < previous_count;
            for &(le, cumulative) in buckets {
                let before = if reset {
                    0.0
                } else {
                    bucket_at(previous_buckets, le)
                };
                add_bucket(&mut total.buckets, le, cumulative - before);
            }
            if reset {
                total.sum += sum;
                total.count += count;
            } else {
                total.sum += sum - previous_sum;
                total.count += count - previous_count;
            }
            (previous_buckets, previous_sum, previous_count) = (buckets, sum, count);
        }
    }
    total
}

/// The cumulative count of the bucket with bound `le` (0 when absent).
fn bucket_at(buckets: &[(f64, f64)], le: f64) -> f64 {
    buckets
        .binary_search_by(|(bound, _)| bound.total_cmp(&le))
        .map_or(0.0, |at| buckets[at].1)
}

/// Prometheus' `histogram_quantile` over cumulative `buckets` sorted by bound: the rank
/// `q × total` is found in its bucket and interpolated linearly between the bucket's
/// bounds (the first bucket's lower bound is 0, unless its upper bound is not positive);
/// a rank in the `+Inf` bucket gives the highest finite bound. Counts are first made
/// monotonic, as Prometheus does. 0 when there are no observations (Prometheus: NaN).
pub(crate) fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> f64 {
    let mut monotonic: Vec<(f64, f64)> = Vec::with_capacity(buckets.len());
    let mut highest = 0.0f64;
    for &(le, count) in buckets {
        highest = highest.max(count);
        monotonic.push((le, highest));
    }
    let Some(&(_, total)) = monotonic.last() else {
        return 0.0;
    };
    if total <= 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let Some(index) = monotonic.iter().position(|&(_, count)| count >= rank) else {
        return 0.0;
    };
    let (upper, count) = monotonic[index];
    if upper == f64::INFINITY {
        return match index.checked_sub(1) {
            Some(previous) => monotonic[previous].0,
            None => 0.0,
        };
    }
    let (lower, below) = match index.checked_sub(1) {
        Some(previous) => monotonic[previous],
        None if upper <= 0.0 => return upper,
        None => (0.0, 0.0),
    };
    if count == below {
        return upper;
    }
    lower + (upper - lower) * (rank - below) / (count - below)
}

/// The bucket of cumulative `buckets` that [`histogram_quantile`] finds quantile `q` in;
/// `from` 0 and `to` 0 when there are no observations.
pub(crate) fn quantile_bucket(q: f64, buckets: &[(f64, f64)]) -> QuantileBucket {
    let mut highest = 0.0f64;
    let monotonic: Vec<(f64, f64)> = buckets
        .iter()
        .map(|&(le, count)| {
            highest = highest.max(count);
            (le, highest)
        })
        .collect();
    let total = monotonic.last().map_or(0.0, |&(_, total)| total);
    let empty = QuantileBucket {
        from: 0.0,
        to: Some(0.0),
    };
    if total <= 0.0 {
        return empty;
    }
    let rank = q * total;
    let Some(index) = monotonic.iter().position(|&(_, count)| count >= rank) else {
        return empty;
    };
    let upper = monotonic[index].0;
    let from = match index.checked_sub(1) {
        Some(previous) => monotonic[previous].0,
        None => upper.min(0.0),
    };
    QuantileBucket {
        from,
        to: upper.is_finite().then_some(upper),
    }
}

/// Seconds from `earlier` to `later` (0 if `later` is earlier).
fn seconds_between(earlier: SystemTime, later: SystemTime) -> f64 {
    later
        .duration_since(earlier)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

/// Seconds from `origin` to `at`, negative when `at` is earlier.
fn signed_seconds(origin: SystemTime, at: SystemTime) -> f64 {
    match at.duration_since(origin) {
        Ok(after) => after.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests;
