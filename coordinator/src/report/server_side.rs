//! The report's `server` section as every renderer shows it: the endpoints scraped, the
//! families of known servers in a fixed order (queue depth, running requests, KV-cache
//! usage, preemptions, token rates, the server's TTFT and latency beside the client's), a
//! count of the other families, and the series the HTML report plots. One row model, so the
//! terminal, Markdown and HTML reports show the same digits.
//!
//! Everything here may come from the server (a URL, a family name, a note): the rows carry
//! it with its control characters escaped; each renderer escapes it further for its markup.

use std::collections::BTreeMap;

use common::metrics::Stats;
use common::text::escape_controls;

use super::format::NO_VALUE;
use super::{LlmSection, Report};
use crate::server_metrics::{
    COUNTS_CACHED, QuantileBucket, Role, ServerMetric, ServerSection, known_family,
    prompt_tokens_meaning, role_of, server_of,
};

/// What the difference between the client's and the server's time is made of.
pub(super) const DIFFERENCE_NOTE: &str = "network, ingress and client";

/// The roles the report shows, in order (prefix-cache queries only as the cached share's
/// denominator, in the cached-tokens row).
const ROLES: [Role; 10] = [
    Role::QueueDepth,
    Role::Running,
    Role::KvCacheUsage,
    Role::Preemptions,
    Role::PromptTokens,
    Role::CachedPromptTokens,
    Role::PrefixCacheQueries,
    Role::GenerationTokens,
    Role::ServerTtft,
    Role::ServerLatency,
];

/// The server section, ready to print.
pub(super) struct ServerView {
    /// One row per endpoint scraped.
    pub endpoints: Vec<EndpointRow>,
    /// The families of known servers, in [`ROLES`] order (a timing family gives three
    /// rows: p50, p90, p99).
    pub rows: Vec<ServerRow>,
    /// Families of no known role (listed in the JSON, and in the HTML report).
    pub other_families: usize,
    /// Of those, how many are named like a known server's (`vllm:…`), by server.
    pub other_of_known_servers: BTreeMap<&'static str, usize>,
    /// Set when endpoints were configured and none of them answered.
    pub none_answered: Option<String>,
}

/// One endpoint of the server section.
pub(super) struct EndpointRow {
    /// The URL scraped, control characters escaped.
    pub url: String,
    pub scrapes: u64,
    pub errors: u64,
    /// Why it was not scraped or what went wrong, escaped; empty when nothing did.
    pub note: String,
}

/// One row of the server table.
pub(super) struct ServerRow {
    /// What the row measures (`queue depth`, `TTFT p50 (ms)`).
    pub what: String,
    /// What the family measures (`TTFT`): the rows of one timing family share it.
    pub measure: &'static str,
    /// The family it comes from (`vllm:num_requests_waiting`), escaped.
    pub family: String,
    /// The server's numbers (`avg 2.40 · max 7`).
    pub server: String,
    /// The client's number beside it (TTFT and latency rows), else empty.
    pub client: String,
    /// Client − server, signed (TTFT and latency rows), else empty.
    pub difference: String,
}

/// The server section of `report` as rows; `None` when the report has none.
pub(super) fn server_view(report: &Report) -> Option<ServerView> {
    let server = report.server.as_ref()?;
    let endpoints = server
        .endpoints
        .iter()
        .map(|e| EndpointRow {
            url: escape_controls(&e.url).into_owned(),
            scrapes: e.scrapes,
            errors: e.errors,
            // A mixed endpoint's finding is its note: every renderer shows it.
            note: [e.note.as_deref(), e.mixed.as_deref()]
                .into_iter()
                .flatten()
                .map(|n| escape_controls(n).into_owned())
                .collect::<Vec<_>>()
                .join("; "),
        })
        .collect();
    let mut rows = Vec::new();
    let mut known = 0;
    for role in ROLES {
        for (name, metric) in families(server, role) {
            known += 1;
            rows.extend(role_rows(role, name, metric, &report.llm, server));
        }
    }
    let answered = server.endpoints.iter().any(|e| e.scrapes > e.errors);
    let none_answered = (!server.endpoints.is_empty() && !answered).then(|| {
        "no endpoint answered, so there are no server numbers (see each endpoint's note)"
            .to_string()
    });
    let mut other_of_known_servers = BTreeMap::new();
    for (name, _) in other_families(server) {
        if let Some(known_server) = server_of(name) {
            *other_of_known_servers.entry(known_server).or_insert(0) += 1;
        }
    }
    Some(ServerView {
        endpoints,
        rows,
        other_families: server.metrics.len() - known,
        other_of_known_servers,
        none_answered,
    })
}

/// `N more families in the JSON report (M of vLLM, K of no known server)`, or `None` when
/// there are none: a known server's families without a row are its, not "of no known
/// server".
pub(super) fn other_families_text(view: &ServerView) -> Option<String> {
    let n = view.other_families;
    if n == 0 {
        return None;
    }
    let of_known: usize = view.other_of_known_servers.values().sum();
    let mut parts: Vec<String> = view
        .other_of_known_servers
        .iter()
        .map(|(server, count)| format!("{count} of {server}"))
        .collect();
    if n > of_known {
        parts.push(format!("{} of no known server", n - of_known));
    }
    let families = if n == 1 { "family" } else { "families" };
    Some(format!(
        "{n} more {families} in the JSON report ({})",
        parts.join(", ")
    ))
}

/// The families of `role` in `server`, by name.
fn families(server: &ServerSection, role: Role) -> impl Iterator<Item = (&str, &ServerMetric)> {
    server
        .metrics
        .iter()
        .filter(move |(name, _)| role_of(name) == Some(role))
        .map(|(name, metric)| (name.as_str(), metric))
}

/// The families of no known role, by name (the HTML report lists them).
pub(super) fn other_families(server: &ServerSection) -> Vec<(&str, &ServerMetric)> {
    server
        .metrics
        .iter()
        .filter(|(name, _)| role_of(name).is_none())
        .map(|(name, metric)| (name.as_str(), metric))
        .collect()
}

/// What a role's row is called.
fn role_label(role: Role) -> &'static str {
    match role {
        Role::QueueDepth => "queue depth (waiting requests)",
        Role::Running => "running requests",
        Role::KvCacheUsage => "KV-cache usage",
        Role::Preemptions => "preemptions",
        Role::PromptTokens => "prompt tokens/s",
        Role::GenerationTokens => "generation tokens/s",
        Role::ServerTtft => "TTFT",
        Role::ServerLatency => "request latency",
        Role::CachedPromptTokens => "cached prompt share",
        Role::PrefixCacheQueries => "prefix-cache queries",
    }
}

/// The rows of one family.
fn role_rows(
    role: Role,
    name: &str,
    metric: &ServerMetric,
    llm: &LlmSection,
    server: &ServerSection,
) -> Vec<ServerRow> {
    let family = escape_controls(name).into_owned();
    let label = role_label(role);
    let row = |what: String, server: String| ServerRow {
        what,
        measure: label,
        family: family.clone(),
        server,
        client: String::new(),
        difference: String::new(),
    };
    match (role, metric) {
        (Role::QueueDepth | Role::Running, ServerMetric::Gauge { avg, max, .. }) => {
            vec![row(
                label.to_string(),
                format!("avg {avg:.2} · max {}", number(*max)),
            )]
        }
        (Role::KvCacheUsage, ServerMetric::Gauge { avg, max, .. }) => {
            vec![row(
                label.to_string(),
                format!("avg {:.1} % · max {:.1} %", avg * PERCENT, max * PERCENT),
            )]
        }
        (Role::ServerTtft | Role::ServerLatency, ServerMetric::Histogram { .. }) => {
            let client = match role {
                Role::ServerTtft => llm.ttft_ms.as_ref(),
                _ => llm.latency_ms.as_ref(),
            };
            timing_rows(label, name, &family, metric, client)
        }
        (Role::Preemptions, ServerMetric::Counter { delta, .. }) => {
            vec![row(
                label.to_string(),
                format!("{} over the run", number(*delta)),
            )]
        }
        (Role::PromptTokens, ServerMetric::Counter { delta, rate }) => {
            vec![row(
                label.to_string(),
                prompt_text(name, *delta, *rate, llm),
            )]
        }
        (Role::GenerationTokens, ServerMetric::Counter { delta, rate }) => {
            vec![row(label.to_string(), generated_text(*delta, *rate, llm))]
        }
        (Role::CachedPromptTokens, ServerMetric::Counter { delta, .. }) => {
            cached_share_text(name, *delta, server, llm)
                .map(|text| row(label.to_string(), text))
                .into_iter()
                .collect()
        }
        // Read by the cached share's row.
        (Role::PrefixCacheQueries, _) => Vec::new(),
        // TGI and Dynamo count tokens per request in a histogram: its sum is the run's.
        (
            Role::PromptTokens | Role::GenerationTokens,
            ServerMetric::Histogram { count, sum, .. },
        ) => vec![row(
            format!("{} (tokens over the run)", label.trim_end_matches("/s")),
            format!("{} in {} requests", number(*sum), number(*count)),
        )],
        // A family of an unexpected type for its role: its own numbers, as they are.
        _ => vec![row(label.to_string(), summary(name, metric))],
    }
}

/// A timing histogram's p50, p90 and p99 rows in ms, each beside the client's and the
/// difference.
fn timing_rows(
    label: &'static str,
    name: &str,
    family: &str,
    metric: &ServerMetric,
    client: Option<&Stats>,
) -> Vec<ServerRow> {
    // A family of seconds is in ms already, or converted here (a report saved before the
    // conversion); a family of ms is as it is.
    let ServerMetric::Histogram {
        count,
        p50,
        p90,
        p99,
        ..
    } = metric.in_ms(name)
    else {
        return Vec::new();
    };
    let buckets = match metric.in_ms(name) {
        ServerMetric::Histogram { buckets, .. } => buckets,
        _ => None,
    };
    let bucket = |i: usize| buckets.map(|b| b[i]);
    let stats: [(&str, f64, Option<f64>, Option<QuantileBucket>); 3] = [
        ("p50", p50, client.map(|s| s.p50), bucket(0)),
        ("p90", p90, client.map(|s| s.p90), bucket(1)),
        ("p99", p99, client.map(|s| s.p99), bucket(2)),
    ];
    let ms = |v: Option<f64>| v.map_or_else(|| NO_VALUE.to_string(), |v| format!("{v:.2}"));
    stats
        .into_iter()
        .map(|(stat, value, client, bucket)| {
            let server = (count > 0.0 && value.is_finite()).then_some(value);
            ServerRow {
                what: format!("{label} {stat} (ms)"),
                measure: label,
                family: family.to_string(),
                server: match (server, bucket) {
                    (Some(value), Some(bucket)) => {
                        format!("{value:.2} ({})", bucket_text(bucket))
                    }
                    _ => ms(server),
                },
                client: ms(client),
                difference: match (client, server) {
                    (Some(c), Some(s)) => difference_text(c, s, bucket),
                    _ => NO_VALUE.to_string(),
                },
            }
        })
        .collect()
}

/// The bucket a server quantile lies in, `250–500` (ms), `> 2560` for the `+Inf` one.
fn bucket_text(bucket: QuantileBucket) -> String {
    match bucket.to {
        Some(to) => format!("{}–{}", number(bucket.from), number(to)),
        None => format!("> {}", number(bucket.from)),
    }
}

/// Client − server where it means something: the server's quantile is interpolated inside
/// its bucket, so a difference no wider than the bucket is within its resolution
/// (`within the bucket`), and a client below the server's whole bucket is not a negative
/// network time (other requests, or an other clock) — never a negative difference.
fn difference_text(client: f64, server: f64, bucket: Option<QuantileBucket>) -> String {
    let difference = client - server;
    match bucket {
        // A report saved before buckets were kept: the difference, when it is not negative.
        None if difference >= 0.0 => format!("{difference:+.2}"),
        None => NO_VALUE.to_string(),
        Some(bucket) if client < bucket.from => "- (client below the server's bucket)".to_string(),
        Some(bucket) => match bucket.width() {
            Some(width) if difference > width => format!("{difference:+.2}"),
            _ => "within the bucket".to_string(),
        },
    }
}

/// The input tokens the run itself sent, from its input-length distribution.
fn client_input_tokens(llm: &LlmSection) -> Option<f64> {
    llm.isl_tokens
        .as_ref()
        .filter(|isl| isl.count > 0)
        .map(|isl| isl.avg * isl.count as f64)
}

/// A prompt-token counter's rate and total, what its server counts (vLLM counts cached
/// tokens, llama.cpp does not) and the run's own count beside it.
fn prompt_text(name: &str, delta: f64, rate: f64, llm: &LlmSection) -> String {
    let mut text = format!("{rate:.2} · {} in the run", number(delta));
    if let Some(known) = known_family(name)
        && let Some(meaning) = prompt_tokens_meaning(known.server)
    {
        text.push_str(&format!(", {} {meaning}", known.server));
    }
    if let Some(sent) = client_input_tokens(llm) {
        text.push_str(&format!(" · the run sent {}", number(sent.round())));
    }
    text
}

/// A generated-token counter's rate and total, the run's own count beside it.
fn generated_text(delta: f64, rate: f64, llm: &LlmSection) -> String {
    format!(
        "{rate:.2} · {} in the run · the run received {}",
        number(delta),
        llm.output_tokens
    )
}

/// The share of prompt tokens the server served from its prefix cache, by its own counters:
/// cached tokens over the same server's prefix-cache queries, or over its prompt tokens
/// when those count cached ones too (SGLang); the share the run's usage reports gave
/// beside it. `None` when the server has no denominator.
fn cached_share_text(
    name: &str,
    cached: f64,
    server: &ServerSection,
    llm: &LlmSection,
) -> Option<String> {
    let owner = known_family(name)?.server;
    let denominator = |role: Role| {
        server
            .metrics
            .iter()
            .find_map(|(other, metric)| match metric {
                ServerMetric::Counter { delta, .. }
                    if role_of(other) == Some(role)
                        && known_family(other).is_some_and(|k| k.server == owner) =>
                {
                    Some(*delta)
                }
                _ => None,
            })
    };
    let of = denominator(Role::PrefixCacheQueries).or_else(|| {
        // Only a prompt counter that counts cached tokens too is a denominator.
        (prompt_tokens_meaning(owner)? == COUNTS_CACHED)
            .then(|| denominator(Role::PromptTokens))
            .flatten()
    })?;
    let share = if of > 0.0 { cached / of * PERCENT } else { 0.0 };
    let mut text = format!(
        "{share:.1} % ({} of {} prompt tokens, the server's own count)",
        number(cached),
        number(of)
    );
    if let Some(usage) = llm.cached_input_share_pct {
        text.push_str(&format!(" · usage reports: {usage:.1} %"));
    }
    Some(text)
}

/// KV-cache usage is a fraction of 1 for every known server (`server_metrics::Role`):
/// shown in percent.
const PERCENT: f64 = 100.0;

/// A family's numbers by its type, for a family of an unexpected type or of no role (a
/// histogram of seconds in ms, with its unit).
pub(super) fn summary(name: &str, metric: &ServerMetric) -> String {
    let metric = metric.in_ms(name);
    let unit = if metric.is_ms() { " ms" } else { "" };
    match metric {
        ServerMetric::Gauge {
            avg,
            min,
            max,
            last,
        } => format!(
            "avg {:.2} · min {} · max {} · last {}",
            avg,
            number(min),
            number(max),
            number(last)
        ),
        ServerMetric::Counter { delta, rate } => {
            format!("{} over the run ({rate:.2}/s)", number(delta))
        }
        ServerMetric::Histogram {
            count,
            sum,
            p50,
            p90,
            p99,
            ..
        } => format!(
            "count {} · sum {}{unit} · p50 {}{unit} · p90 {}{unit} · p99 {}{unit}",
            number(count),
            number(sum),
            number(p50),
            number(p90),
            number(p99)
        ),
    }
}

/// Whole numbers without decimals (`7`), others with two (`2.40`), `-` when not a number.
fn number(value: f64) -> String {
    if !value.is_finite() {
        NO_VALUE.to_string()
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

/// The largest queue depth any queue family of `server` reached: the sweep and capacity
/// tables' `server queue max`.
pub(super) fn queue_max(server: Option<&ServerSection>) -> Option<f64> {
    families(server?, Role::QueueDepth)
        .filter_map(|(_, metric)| match metric {
            ServerMetric::Gauge { max, .. } => Some(*max),
            _ => None,
        })
        .reduce(f64::max)
}

/// `server queue max` cell of a sweep level or probe: the number, or `-`.
pub(super) fn queue_max_cell(server: Option<&ServerSection>) -> String {
    queue_max(server).map_or_else(|| NO_VALUE.to_string(), number)
}

/// A probe's server-queue cell: the model server's sampled queue max, and beside it, when
/// a gateway's families were scraped, the gateway's own figures, named as the gateway's
/// (`0 · gateway: queue 18.3 ms mean, 7 in flight`).
pub(super) fn server_queue_cell(probe: &super::ProbeSection) -> String {
    let server = queue_max_cell(probe.server.as_ref());
    let Some(section) = &probe.server else {
        return server;
    };
    let figures = crate::server_metrics::gateway::TierFigures::of(section);
    if !figures.has_gateway() {
        return server;
    }
    let mut gateway = Vec::new();
    if let Some(ms) = figures.gateway_queue_ms {
        gateway.push(format!("queue {ms:.1} ms mean"));
    }
    if let Some(max) = figures.gateway_in_flight_max {
        gateway.push(format!("{max:.0} in flight"));
    }
    format!("{server} · gateway: {}", gateway.join(", "))
}

/// Header of the sweep and capacity tables' column.
pub(super) const QUEUE_MAX_HEADER: &str = "server queue max";

/// The capacity table's queue column: the largest *scraped* queue depth, a sample every
/// interval, so a queue that peaked between two scrapes shows lower than it was.
pub(super) fn sampled_queue_max_header(interval_s: Option<f64>) -> String {
    match interval_s {
        Some(seconds) => format!(
            "{QUEUE_MAX_HEADER} (sampled every {})",
            super::format::duration_text(seconds)
        ),
        None => format!("{QUEUE_MAX_HEADER} (sampled)"),
    }
}

/// One plotted series: the family's name and its connected runs of `(t_s, value)`.
pub(super) type TimeSeries = (String, Vec<Vec<(f64, f64)>>);

/// The families of `role` over the run (`server.timeline`): gauge values, counter rates;
/// KV-cache usage in percent. A point where a family has no value breaks its line.
pub(super) fn role_series(server: &ServerSection, role: Role) -> Vec<TimeSeries> {
    let mut by_family: BTreeMap<&str, Vec<Vec<(f64, f64)>>> = BTreeMap::new();
    for name in server
        .timeline
        .iter()
        .flat_map(|point| point.values.keys())
        .filter(|name| role_of(name) == Some(role))
    {
        by_family.entry(name.as_str()).or_default();
    }
    for (name, segments) in &mut by_family {
        let mut open = false;
        for point in &server.timeline {
            match point.values.get(*name) {
                Some(v) if v.is_finite() => {
                    if !open {
                        segments.push(Vec::new());
                    }
                    if let Some(segment) = segments.last_mut() {
                        segment.push((point.t_s, *v));
                    }
                    open = true;
                }
                _ => open = false,
            }
        }
        if role == Role::KvCacheUsage {
            for point in segments.iter_mut().flatten() {
                point.1 *= PERCENT;
            }
        }
    }
    by_family
        .into_iter()
        .filter(|(_, segments)| !segments.is_empty())
        .map(|(name, segments)| (escape_controls(name).into_owned(), segments))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(from: f64, to: f64) -> Option<QuantileBucket> {
        Some(QuantileBucket { from, to: Some(to) })
    }

    /// The numbers: a server p90 interpolated to 250.0 inside 100–250 ms cannot give
    /// the client's 224.3 a "−25.7 ms" of network; a difference wider than the bucket shows.
    #[test]
    fn a_difference_is_shown_only_beyond_the_buckets_resolution_and_never_negative() {
        assert_eq!(
            difference_text(224.3, 250.0, bucket(100.0, 250.0)),
            "within the bucket"
        );
        assert_eq!(
            difference_text(90.0, 120.0, bucket(100.0, 250.0)),
            "- (client below the server's bucket)"
        );
        assert_eq!(
            difference_text(300.0, 240.0, bucket(100.0, 250.0)),
            "within the bucket"
        );
        assert_eq!(
            difference_text(420.0, 240.0, bucket(100.0, 250.0)),
            "+180.00"
        );
        // No bucket (a report saved before they were kept): never negative.
        assert_eq!(difference_text(224.3, 250.0, None), NO_VALUE);
        assert_eq!(difference_text(260.0, 250.0, None), "+10.00");
        assert_eq!(
            bucket_text(QuantileBucket {
                from: 2_560_000.0,
                to: None
            }),
            "> 2560000"
        );
    }
}
