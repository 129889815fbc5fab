//! Live metrics for dashboards: `run --metrics-listen ADDR` serves the supervisor's merged
//! state as Prometheus text on `/metrics` while the run goes, labelled with the run id.
//!
//! Histograms are classic Prometheus histograms whose bucket counts are read exactly from
//! the merged HDR histograms (to their 3 significant digits): `le` bounds on a 1-2-5 scale.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use common::accept;
use common::metrics::{Metric, RunMetrics};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::supervisor::RunSnapshot;

/// The histograms served, with their Prometheus names and help. Times are in seconds.
const HISTOGRAMS: [(Metric, &str, &str); 7] = [
    (
        Metric::Ttft,
        "llm_replay_ttft_seconds",
        "Time to first token of measured streamed requests.",
    ),
    (
        Metric::Ttst,
        "llm_replay_ttst_seconds",
        "Time from the first to the second content frame.",
    ),
    (
        Metric::Itl,
        "llm_replay_itl_seconds",
        "Inter-token latency of measured streamed requests.",
    ),
    (
        Metric::Latency,
        "llm_replay_request_latency_seconds",
        "Request latency (last content frame) of measured requests.",
    ),
    (
        Metric::ScheduleLag,
        "llm_replay_schedule_lag_seconds",
        "Actual minus intended send time on a recorded schedule or a rate.",
    ),
    (
        Metric::Connect,
        "llm_replay_connect_seconds",
        "Setup (resolution and TCP connect) of each connection opened to the target.",
    ),
    (
        Metric::Osl,
        "llm_replay_output_tokens",
        "Output sequence length of measured requests (tokens).",
    ),
];

/// Upper bounds of the buckets, in the metric's Prometheus unit (seconds or tokens), written
/// out so that they print exactly.
fn bounds(metric: Metric) -> &'static [f64] {
    if metric == Metric::Osl {
        &[
            1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
            20000.0, 50000.0,
        ]
    } else {
        &[
            0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
            5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0,
        ]
    }
}

/// HDR units (µs for times, tokens for lengths) per Prometheus unit.
fn hdr_per_unit(metric: Metric) -> f64 {
    if metric == Metric::Osl { 1.0 } else { 1e6 }
}

/// Connections served at once; more wait in the listener's backlog (the kernel's, not ours:
/// they hold no descriptor of this process) until one ends.
pub const MAX_CONNECTIONS: usize = 64;

/// Time a connection gets to send a request head, and to send the next one on a kept-alive
/// connection: a silent connection is closed after this.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a connection is served in all, whatever it does (a scrape takes
/// milliseconds; a scraper reconnects).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// How `--metrics-listen` accepts connections (`common::accept`).
const LIMITS: accept::AcceptLimits = accept::AcceptLimits {
    name: "--metrics-listen",
    max_connections: MAX_CONNECTIONS,
    head_timeout: Some(HEAD_TIMEOUT),
};

/// Serve `/metrics` from `state` on `listener` until `shutdown` turns true (or its sender
/// goes); open scrapes are then closed.
///
/// Never fails and never stops the run: connections are accepted by `common::accept`, at
/// most [`MAX_CONNECTIONS`] at once, each closed when its request head takes over
/// [`HEAD_TIMEOUT`] and in any case after [`CONNECTION_LIFETIME`]; a failed accept is logged
/// once and retried after a pause.
pub async fn serve(
    listener: TcpListener,
    state: watch::Receiver<RunSnapshot>,
    mut shutdown: watch::Receiver<bool>,
) {
    let builder = accept::http_builder(HEAD_TIMEOUT).http1_only();
    let stopped = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    let connections = accept::serve(listener, &LIMITS, stopped, move |stream, _peer| {
        let state = state.clone();
        let builder = builder.clone();
        async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(respond(&request, &state.borrow())) }
            });
            let connection =
                builder.serve_connection(accept::http_io(stream, HEAD_TIMEOUT), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
        }
    })
    .await;
    connections.abort().await;
}

fn respond(request: &Request<Incoming>, state: &RunSnapshot) -> Response<Full<Bytes>> {
    let (status, content_type, body) = if request.uri().path() == "/metrics" {
        (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            render(state),
        )
    } else {
        (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "llm-replay serves /metrics\n".to_owned(),
        )
    };
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("a static status and header make a valid response")
}

/// Escape a label value (Prometheus text format: backslash, quote, newline).
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text exposition of one state.
pub fn render(state: &RunSnapshot) -> String {
    let mut out = String::new();
    let run = format!("run_id=\"{}\"", label_value(&state.run_id));
    let metrics: &RunMetrics = &state.metrics;
    for (metric, name, help) in HISTOGRAMS {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let histogram = metrics.histogram(metric);
        let per_unit = hdr_per_unit(metric);
        let mut counted = 0u64;
        let mut values = histogram.iter_recorded().peekable();
        for &bound in bounds(metric) {
            let limit = (bound * per_unit).round();
            while let Some(value) = values.peek() {
                if value.value_iterated_to() as f64 <= limit {
                    counted += value.count_at_value();
                    values.next();
                } else {
                    break;
                }
            }
            let _ = writeln!(out, "{name}_bucket{{{run},le=\"{bound}\"}} {counted}");
        }
        let total = histogram.len();
        let sum = histogram.mean() * total as f64 / per_unit;
        let _ = writeln!(out, "{name}_bucket{{{run},le=\"+Inf\"}} {total}");
        let _ = writeln!(out, "{name}_sum{{{run}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{run}}} {total}");
    }
    let c = &metrics.counters;
    let _ = writeln!(
        out,
        "# HELP llm_replay_requests_total Requests by outcome (measured; warm-up apart)."
    );
    let _ = writeln!(out, "# TYPE llm_replay_requests_total counter");
    for (outcome, n) in [
        ("succeeded", c.succeeded),
        ("ended_early", c.ended_early),
        ("failed_status", c.failed_status),
        ("failed_error_frame", c.failed_error_frame),
        ("failed_transport", c.failed_transport),
        ("failed_timeout", c.failed_timeout),
        ("failed_empty", c.failed_empty),
        ("warmup", c.warmup),
        ("lost", state.totals.lost),
        ("not_started", state.totals.not_started),
    ] {
        let _ = writeln!(
            out,
            "llm_replay_requests_total{{{run},outcome=\"{outcome}\"}} {n}"
        );
    }
    let gauges: [(&str, &str, &str, f64); 7] = [
        (
            "llm_replay_output_tokens_total",
            "counter",
            "Output tokens of measured requests.",
            c.output_tokens as f64,
        ),
        (
            "llm_replay_output_tokens_per_second",
            "gauge",
            "Output token throughput over the measured window so far.",
            metrics.output_tokens_per_second(),
        ),
        (
            "llm_replay_requests_per_second",
            "gauge",
            "Request throughput over the measured window so far.",
            metrics.requests_per_second(),
        ),
        (
            "llm_replay_in_flight_requests",
            "gauge",
            "Requests sent and not answered yet.",
            state.in_flight as f64,
        ),
        (
            "llm_replay_workers_alive",
            "gauge",
            "Workers taking part and not lost.",
            state.alive as f64,
        ),
        (
            "llm_replay_workers",
            "gauge",
            "Workers of the run.",
            state.workers as f64,
        ),
        (
            "llm_replay_run_finished",
            "gauge",
            "1 once the run is over and these are its final numbers.",
            if state.finished { 1.0 } else { 0.0 },
        ),
    ];
    for (name, kind, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{{run}}} {value}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The endpoint on 127.0.0.1:0, and the sender that stops it.
    async fn start() -> (std::net::SocketAddr, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        // The state's sender may go: the last value stays readable.
        let (_, state) = watch::channel(RunSnapshot::default());
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(serve(listener, state, stopped));
        (addr, stop)
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_after_the_head_timeout() {
        let (addr, _stop) = start().await;
        let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut buf = [0u8; 64];
        // Paused time: the server's head timer fires after HEAD_TIMEOUT of virtual time,
        // long before the connection's lifetime; a server without one leaves this read
        // waiting until the bound.
        let bound = (HEAD_TIMEOUT + CONNECTION_LIFETIME) / 2;
        let read = tokio::time::timeout(bound, silent.read(&mut buf))
            .await
            .expect("the server closes a connection that sends no request head");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }

    #[tokio::test]
    async fn metrics_are_served_and_other_paths_are_not_found() {
        let (addr, stop) = start().await;
        for (path, status) in [("/metrics", "200"), ("/other", "404")] {
            let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            stream
                .write_all(format!("GET {path} HTTP/1.0\r\nhost: x\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut response = String::new();
            stream
                .read_to_string(&mut response)
                .await
                .expect("a response");
            assert!(
                response.starts_with(&format!("HTTP/1.0 {status}")),
                "{response}"
            );
        }
        stop.send(true).expect("the server listens");
    }

    #[test]
    fn buckets_are_cumulative_and_exact_to_the_hdr_precision() {
        let mut metrics = RunMetrics::new();
        // TTFT 0.8 ms, 3 ms, 3 ms, 40 ms, 7 s (µs in the HDR histogram).
        for us in [800, 3_000, 3_000, 40_000, 7_000_000] {
            metrics.record_value(Metric::Ttft, us);
        }
        metrics.counters.succeeded = 5;
        let state = RunSnapshot {
            run_id: "r\"1".into(),
            metrics: std::sync::Arc::new(metrics),
            workers: 2,
            alive: 2,
            ..RunSnapshot::default()
        };
        let text = render(&state);
        let line = |le: &str| {
            let prefix =
                format!("llm_replay_ttft_seconds_bucket{{run_id=\"r\\\"1\",le=\"{le}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .unwrap_or_else(|| panic!("no bucket le={le} in\n{text}"))
                .to_owned()
        };
        assert_eq!(line("0.0005"), "0");
        assert_eq!(line("0.001"), "1");
        assert_eq!(line("0.002"), "1");
        assert_eq!(line("0.005"), "3");
        assert_eq!(line("0.05"), "4");
        assert_eq!(line("5"), "4");
        assert_eq!(line("10"), "5");
        assert_eq!(line("+Inf"), "5");
        assert!(text.contains("llm_replay_ttft_seconds_count{run_id=\"r\\\"1\"} 5"));
        assert!(
            text.contains("llm_replay_requests_total{run_id=\"r\\\"1\",outcome=\"succeeded\"} 5")
        );
        assert!(text.contains("llm_replay_workers_alive{run_id=\"r\\\"1\"} 2"));
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("llm_replay_ttft_seconds_sum{run_id=\"r\\\"1\"} "))
            .expect("a sum")
            .parse()
            .expect("a number");
        assert!((sum - 7.0468).abs() < 0.01, "sum {sum}");
    }
}
