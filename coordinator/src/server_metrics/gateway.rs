//! The gateway tier: what a gateway in front of the model servers (LiteLLM's proxy) says of
//! its own queue and latency on its `/metrics`, apart from the model server's families
//! (issue 32, item 11). Through a gateway, a search finds the gateway's limit while the
//! model server's queue stays empty; these families show it as the gateway's, and
//! [`tier_at_knee`] says which tier's metrics moved between the highest passing and the
//! lowest failing probe.
//!
//! LiteLLM's names, checked in its source (github.com/BerriAI/litellm):
//! `litellm/types/integrations/prometheus.py` (`DEFINED_PROMETHEUS_METRICS`:
//! `litellm_request_queue_time_seconds`, "time a request waits in the proxy before dispatch";
//! `litellm_request_total_latency_metric`, seconds, arrival to the end of processing;
//! `litellm_in_flight_requests`) and `litellm/proxy/middleware/in_flight_requests_middleware.py`
//! (the `litellm_in_flight_requests` gauge: HTTP requests in flight on the proxy worker,
//! waiting ones included). Their histograms use `LATENCY_BUCKETS`, in seconds.

use super::{Role, ServerMetric, ServerSection, role_of};

/// What a gateway family tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayRole {
    /// Requests inside the gateway, waiting or forwarded (gauge).
    InFlight,
    /// Arrival → dispatch upstream (histogram, seconds): the gateway's own queue.
    QueueTime,
    /// Arrival → response end through the gateway (histogram, seconds).
    Latency,
}

/// One gateway family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewayFamily {
    pub name: &'static str,
    pub gateway: &'static str,
    pub role: GatewayRole,
}

const GATEWAY_FAMILIES: &[GatewayFamily] = &[
    GatewayFamily {
        name: "litellm_in_flight_requests",
        gateway: "LiteLLM",
        role: GatewayRole::InFlight,
    },
    GatewayFamily {
        name: "litellm_request_queue_time_seconds",
        gateway: "LiteLLM",
        role: GatewayRole::QueueTime,
    },
    GatewayFamily {
        name: "litellm_request_total_latency_metric",
        gateway: "LiteLLM",
        role: GatewayRole::Latency,
    },
];

/// The gateway role of family `name` (as the report keys it), if it is a known one.
pub fn gateway_role_of(name: &str) -> Option<GatewayRole> {
    GATEWAY_FAMILIES
        .iter()
        .find(|family| family.name == name)
        .map(|family| family.role)
}

/// A gateway timing family in seconds whose name does not say so
/// (`litellm_request_total_latency_metric`): `known::in_seconds` asks here.
pub fn is_gateway_timing(name: &str) -> bool {
    matches!(
        gateway_role_of(name),
        Some(GatewayRole::QueueTime | GatewayRole::Latency)
    )
}

/// One probe's figures, tier by tier.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TierFigures {
    /// The gateway's mean queue time, ms (sum ÷ count of its queue-time histogram).
    pub gateway_queue_ms: Option<f64>,
    /// The gateway's in-flight requests, the largest sample.
    pub gateway_in_flight_max: Option<f64>,
    /// The gateway's mean latency, ms.
    pub gateway_latency_ms: Option<f64>,
    /// The model server's queue depth, the largest sample (its known queue families).
    pub server_queue_max: Option<f64>,
}

impl TierFigures {
    /// The figures of one probe's (or run's) server section.
    pub fn of(section: &ServerSection) -> TierFigures {
        let mut figures = TierFigures::default();
        for (name, metric) in &section.metrics {
            let metric = metric.in_ms(name);
            match (gateway_role_of(name), &metric) {
                (Some(GatewayRole::QueueTime), ServerMetric::Histogram { count, sum, .. })
                    if *count > 0.0 =>
                {
                    figures.gateway_queue_ms = Some(sum / count);
                }
                (Some(GatewayRole::Latency), ServerMetric::Histogram { count, sum, .. })
                    if *count > 0.0 =>
                {
                    figures.gateway_latency_ms = Some(sum / count);
                }
                (Some(GatewayRole::InFlight), ServerMetric::Gauge { max, .. }) => {
                    figures.gateway_in_flight_max = Some(*max);
                }
                _ => {}
            }
            if role_of(name) == Some(Role::QueueDepth)
                && let ServerMetric::Gauge { max, .. } = metric
            {
                figures.server_queue_max =
                    Some(figures.server_queue_max.map_or(max, |m| m.max(max)));
            }
        }
        figures
    }

    /// Whether any gateway family was there.
    pub fn has_gateway(&self) -> bool {
        self.gateway_queue_ms.is_some()
            || self.gateway_in_flight_max.is_some()
            || self.gateway_latency_ms.is_some()
    }
}

/// Which tier set the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Gateway,
    ModelServer,
    Both,
}

impl Tier {
    /// The name the report gives it.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Gateway => "gateway",
            Tier::ModelServer => "model server",
            Tier::Both => "gateway and model server",
        }
    }
}

/// A queue time that grew to at least this (ms) and to [`GREW_FACTOR`] × its value below
/// the knee moved; a shorter one is the gateway's own overhead.
const QUEUE_MOVED_MS: f64 = 5.0;
const GREW_FACTOR: f64 = 2.0;

/// Which tier's queue moved between `below` (the highest passing probe) and `above` (the
/// lowest failing one), with the figures in words; `None` when neither tier's metrics
/// were scraped there, or neither moved.
pub fn tier_at_knee(below: &TierFigures, above: &TierFigures) -> Option<(Tier, String)> {
    let gateway_moved = match (below.gateway_queue_ms, above.gateway_queue_ms) {
        (Some(b), Some(a)) => a >= QUEUE_MOVED_MS && a >= GREW_FACTOR * b,
        _ => false,
    };
    let server_moved = match (below.server_queue_max, above.server_queue_max) {
        (Some(b), Some(a)) => a >= 1.0 && a > b,
        _ => false,
    };
    let gateway = |f: &TierFigures| {
        f.gateway_queue_ms
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1} ms"))
    };
    let server = |f: &TierFigures| {
        f.server_queue_max
            .map_or_else(|| "not scraped".to_owned(), |max| format!("{max:.0}"))
    };
    let figures = format!(
        "the gateway's mean queue time went from {} to {}, the model server's queue max from {} to {}",
        gateway(below),
        gateway(above),
        server(below),
        server(above)
    );
    let tier = match (gateway_moved, server_moved) {
        (true, false) => Tier::Gateway,
        (false, true) => Tier::ModelServer,
        (true, true) => Tier::Both,
        (false, false) => return None,
    };
    let verdict = match tier {
        Tier::Gateway if above.server_queue_max.is_some() => {
            "the gateway is the limit: its queue grew at the knee while the model server's queue stayed empty"
        }
        Tier::Gateway => "the gateway is the limit: its queue grew at the knee",
        Tier::ModelServer => {
            "the model server is the limit: its queue grew at the knee, not the gateway's"
        }
        Tier::Both => "both tiers queued at the knee",
    };
    Some((tier, format!("{verdict} ({figures})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(gateway_queue_ms: Option<f64>, server_queue_max: Option<f64>) -> TierFigures {
        TierFigures {
            gateway_queue_ms,
            server_queue_max,
            ..TierFigures::default()
        }
    }

    #[test]
    fn the_tier_whose_queue_moved_is_named() {
        let (tier, text) = tier_at_knee(
            &figures(Some(0.1), Some(0.0)),
            &figures(Some(18.0), Some(0.0)),
        )
        .expect("the gateway moved");
        assert_eq!(tier, Tier::Gateway);
        assert!(text.starts_with("the gateway is the limit"), "{text}");
        assert!(text.contains("from 0.1 ms to 18.0 ms"), "{text}");
        let (tier, _) = tier_at_knee(
            &figures(Some(0.1), Some(0.0)),
            &figures(Some(0.2), Some(6.0)),
        )
        .expect("the server moved");
        assert_eq!(tier, Tier::ModelServer);
        assert_eq!(
            tier_at_knee(&figures(None, Some(0.0)), &figures(None, Some(0.0))),
            None
        );
        assert_eq!(
            gateway_role_of("litellm_request_queue_time_seconds"),
            Some(GatewayRole::QueueTime)
        );
        assert!(is_gateway_timing("litellm_request_total_latency_metric"));
        assert!(!is_gateway_timing("litellm_in_flight_requests"));
    }
}
