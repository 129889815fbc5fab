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
use crate::server_metrics::{Role, ServerMetric, ServerSection, role_of};

/// What the difference between the client's and the server's time is made of.
pub(super) const DIFFERENCE_NOTE: &str = "network, ingress and client";

/// The roles the report shows, in order.
const ROLES: [Role; 8] = [
    Role::QueueDepth,
    Role::Running,
    Role::KvCacheUsage,
    Role::Preemptions,
    Role::PromptTokens,
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
            rows.extend(role_rows(role, name, metric, &report.llm));
        }
    }
    let answered = server.endpoints.iter().any(|e| e.scrapes > e.errors);
    let none_answered = (!server.endpoints.is_empty() && !answered).then(|| {
        "no endpoint answered, so there are no server numbers (see each endpoint's note)"
            .to_string()
    });
    Some(ServerView {
        endpoints,
        rows,
        other_families: server.metrics.len() - known,
        none_answered,
    })
}

/// `N more families in the JSON report`, or `None` when there are none.
pub(super) fn other_families_text(view: &ServerView) -> Option<String> {
    match view.other_families {
        0 => None,
        1 => Some("1 more family (of no known server) in the JSON report".to_string()),
        n => Some(format!(
            "{n} more families (of no known server) in the JSON report"
        )),
    }
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
    }
}

/// The rows of one family.
fn role_rows(role: Role, name: &str, metric: &ServerMetric, llm: &LlmSection) -> Vec<ServerRow> {
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
        (Role::PromptTokens | Role::GenerationTokens, ServerMetric::Counter { rate, .. }) => {
            vec![row(label.to_string(), format!("{rate:.2}"))]
        }
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
    let stats: [(&str, f64, Option<f64>); 3] = [
        ("p50", p50, client.map(|s| s.p50)),
        ("p90", p90, client.map(|s| s.p90)),
        ("p99", p99, client.map(|s| s.p99)),
    ];
    let ms = |v: Option<f64>| v.map_or_else(|| NO_VALUE.to_string(), |v| format!("{v:.2}"));
    stats
        .into_iter()
        .map(|(stat, value, client)| {
            let server = (count > 0.0 && value.is_finite()).then_some(value);
            ServerRow {
                what: format!("{label} {stat} (ms)"),
                measure: label,
                family: family.to_string(),
                server: ms(server),
                client: ms(client),
                difference: match (client, server) {
                    (Some(c), Some(s)) => format!("{:+.2}", c - s),
                    _ => NO_VALUE.to_string(),
                },
            }
        })
        .collect()
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
