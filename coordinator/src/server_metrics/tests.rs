//! Tests of the window statistics (on hand-built logs) and of the scraper (against tiny
//! in-process HTTP servers).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::parse::{parse, reduce};
use super::scrape::{MAX_BODY_BYTES, request_timeout};
use super::*;

/// The instant `seconds` after an arbitrary origin.
fn at(seconds: f64) -> SystemTime {
    let origin = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    if seconds < 0.0 {
        origin - Duration::from_secs_f64(-seconds)
    } else {
        origin + Duration::from_secs_f64(seconds)
    }
}

/// Families from Prometheus text.
fn families(text: &str) -> Families {
    reduce(&parse(text.as_bytes()).expect("test text is valid"))
}

/// A log of `endpoints` endpoints and the given rounds.
fn log(endpoints: usize, rounds: Vec<(f64, Vec<Option<Families>>)>) -> ScrapeLog {
    ScrapeLog {
        endpoints: (0..endpoints)
            .map(|e| EndpointLog {
                url: format!("http://replica-{e}/metrics"),
                ..EndpointLog::default()
            })
            .collect(),
        rounds: rounds
            .into_iter()
            .map(|(seconds, values)| Round {
                at: at(seconds),
                replicas: vec![None; values.len()],
                values,
            })
            .collect(),
    }
}

fn gauge(value: f64) -> Families {
    families(&format!("# TYPE g gauge\ng{{a=\"1\"}} {value}\n"))
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() < 1e-9
}

#[test]
fn gauge_statistics_over_the_window_and_a_short_window() {
    let log = log(
        1,
        [2.0, 4.0, 6.0, 8.0]
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as f64, vec![Some(gauge(v))]))
            .collect(),
    );
    let section = log.section(at(0.5), at(2.5), at(0.0));
    assert_eq!(
        section.metrics.get("g"),
        Some(&ServerMetric::Gauge {
            avg: 5.0,
            min: 4.0,
            max: 6.0,
            last: 6.0
        })
    );
    // No round inside: the last one at or before `from`.
    let short = log.section(at(3.2), at(3.4), at(0.0));
    assert_eq!(
        short.metrics.get("g"),
        Some(&ServerMetric::Gauge {
            avg: 8.0,
            min: 8.0,
            max: 8.0,
            last: 8.0
        })
    );
}

#[test]
fn gauges_sum_over_label_sets_and_endpoints_carrying_a_failed_scrape() {
    let two_series = || families("# TYPE g gauge\ng{a=\"1\"} 1\ng{a=\"2\"} 2\n");
    let log = log(
        2,
        vec![
            (0.0, vec![Some(two_series()), Some(gauge(10.0))]),
            (1.0, vec![Some(two_series()), None]),
            (2.0, vec![Some(two_series()), Some(gauge(20.0))]),
        ],
    );
    let section = log.section(at(0.0), at(2.0), at(0.0));
    assert_eq!(
        section.metrics.get("g"),
        Some(&ServerMetric::Gauge {
            avg: (13.0 + 13.0 + 23.0) / 3.0,
            min: 13.0,
            max: 23.0,
            last: 23.0
        })
    );
    assert_eq!(section.endpoints[0].scrapes, 3);
    assert_eq!(section.endpoints[1].scrapes, 2);
}

#[test]
fn counters_handle_a_reset_and_sum_endpoints() {
    let counter = |v: f64| families(&format!("# TYPE c_total counter\nc_total {v}\n"));
    let log = log(
        2,
        [100.0, 150.0, 30.0, 80.0, 90.0]
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as f64, vec![Some(counter(v)), Some(counter(i as f64))]))
            .collect(),
    );
    // From round 0 to round 3: 50, then a reset (30 counts from zero), then 50; plus 3.
    let section = log.section(at(0.0), at(3.0), at(0.0));
    let Some(ServerMetric::Counter { delta, rate }) = section.metrics.get("c_total").copied()
    else {
        panic!("no counter: {section:?}");
    };
    assert!(close(delta, 133.0), "{delta}");
    assert!(close(rate, 133.0 / 3.0), "{rate}");
    // The rounds that bound the window: 0.9 → round 0 (the last before it), 3.4 → round 4
    // (the first after it): 50, the reset's 30, 50, 10; plus 4.
    let section = log.section(at(0.9), at(3.4), at(0.0));
    let Some(ServerMetric::Counter { delta, .. }) = section.metrics.get("c_total").copied() else {
        panic!("no counter");
    };
    assert!(close(delta, 50.0 + 30.0 + 50.0 + 10.0 + 4.0), "{delta}");
}

#[test]
fn histogram_quantiles_from_bucket_deltas() {
    let histogram = |b: [f64; 4], sum: f64| {
        families(&format!(
            "# TYPE h_seconds histogram\n\
             h_seconds_bucket{{le=\"0.1\",m=\"x\"}} {}\n\
             h_seconds_bucket{{le=\"0.5\",m=\"x\"}} {}\n\
             h_seconds_bucket{{le=\"1\",m=\"x\"}} {}\n\
             h_seconds_bucket{{le=\"+Inf\",m=\"x\"}} {}\n\
             h_seconds_sum{{m=\"x\"}} {sum}\n\
             h_seconds_count{{m=\"x\"}} {}\n",
            b[0], b[1], b[2], b[3], b[3]
        ))
    };
    let log = log(
        1,
        vec![
            (0.0, vec![Some(histogram([5.0, 5.0, 5.0, 5.0], 2.0))]),
            (1.0, vec![Some(histogram([15.0, 65.0, 100.0, 105.0], 44.0))]),
        ],
    );
    let section = log.section(at(0.0), at(1.0), at(0.0));
    let Some(ServerMetric::Histogram {
        count,
        sum,
        p50,
        p90,
        p99,
        unit,
        ..
    }) = section.metrics.get("h_seconds").copied()
    else {
        panic!("no histogram: {section:?}");
    };
    // A family of seconds is given in ms (every time a goal reads is in ms).
    assert_eq!(unit, Some(ServerUnit::Ms));
    // Deltas: ≤0.1: 10, ≤0.5: 60, ≤1: 95, +Inf: 100.
    assert!(close(count, 100.0));
    assert!(close(sum, 42_000.0));
    // p50: rank 50 in (0.1, 0.5]: 0.1 + 0.4 × (50 − 10) / 50 s.
    assert!(close(p50, 420.0), "{p50}");
    // p90: rank 90 in (0.5, 1]: 0.5 + 0.5 × (90 − 60) / 35 s.
    assert!(close(p90, 1_000.0 * (0.5 + 0.5 * 30.0 / 35.0)), "{p90}");
    // p99: rank 99 in the +Inf bucket: the highest finite bound.
    assert!(close(p99, 1_000.0), "{p99}");
    assert_eq!(histogram_quantile(0.5, &[]), 0.0);
    assert_eq!(
        histogram_quantile(0.5, &[(1.0, 0.0), (f64::INFINITY, 0.0)]),
        0.0
    );
}

#[test]
fn histograms_sum_across_endpoints_and_survive_a_reset() {
    let histogram = |low: f64, all: f64| {
        families(&format!(
            "# TYPE h histogram\nh_bucket{{le=\"1\"}} {low}\nh_bucket{{le=\"+Inf\"}} {all}\n\
             h_sum {all}\nh_count {all}\n"
        ))
    };
    let log = log(
        2,
        vec![
            (
                0.0,
                vec![Some(histogram(4.0, 8.0)), Some(histogram(0.0, 0.0))],
            ),
            // Endpoint 0 restarted.
            (
                1.0,
                vec![Some(histogram(1.0, 2.0)), Some(histogram(2.0, 2.0))],
            ),
        ],
    );
    let section = log.section(at(0.0), at(1.0), at(0.0));
    let Some(ServerMetric::Histogram {
        count, p50, unit, ..
    }) = section.metrics.get("h").copied()
    else {
        panic!("no histogram");
    };
    // Not a family of seconds: its own unit.
    assert_eq!(unit, None);
    assert!(close(count, 4.0));
    // Deltas: ≤1: 1 + 2 = 3 of 4; rank 2 in (0, 1]: 2/3.
    assert!(close(p50, 2.0 / 3.0), "{p50}");
}

#[test]
fn the_timeline_holds_known_families_on_the_run_axis() {
    let body = |waiting: f64, prompt: f64| {
        families(&format!(
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting {waiting}\n\
             # TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total {prompt}\n\
             # TYPE other gauge\nother 1\n"
        ))
    };
    let log = log(
        1,
        vec![
            (-0.5, vec![Some(body(0.0, 0.0))]),
            (0.5, vec![Some(body(3.0, 100.0))]),
            (1.5, vec![Some(body(1.0, 300.0))]),
        ],
    );
    let section = log.section(at(0.0), at(1.6), at(0.0));
    assert_eq!(section.timeline.len(), 2);
    let first = &section.timeline[0];
    assert!(close(first.t_s, 0.5));
    assert_eq!(first.values.get("vllm:num_requests_waiting"), Some(&3.0));
    assert_eq!(first.values.get("vllm:prompt_tokens_total"), Some(&100.0));
    assert!(!first.values.contains_key("other"));
    assert_eq!(
        section.timeline[1].values.get("vllm:prompt_tokens_total"),
        Some(&200.0)
    );
    // The counter's window runs from the probe (the last round before `from`) to the last round.
    assert_eq!(
        section.metrics.get("vllm:prompt_tokens_total"),
        Some(&ServerMetric::Counter {
            delta: 300.0,
            rate: 150.0
        })
    );
    assert!(section.metrics.contains_key("other"));
}

#[test]
fn the_section_serialises_with_its_type_tags() {
    let section = ServerSection {
        endpoints: vec![ServerEndpoint {
            url: "http://h/metrics".to_owned(),
            scrapes: 3,
            errors: 0,
            note: None,
            mixed: None,
        }],
        metrics: BTreeMap::from([
            (
                "vllm:num_requests_waiting".to_owned(),
                ServerMetric::Gauge {
                    avg: 1.5,
                    min: 0.0,
                    max: 3.0,
                    last: 2.0,
                },
            ),
            (
                "c".to_owned(),
                ServerMetric::Counter {
                    delta: 10.0,
                    rate: 5.0,
                },
            ),
        ]),
        timeline: Vec::new(),
    };
    let json = serde_json::to_value(&section).expect("serialisable");
    assert_eq!(
        json["metrics"]["vllm:num_requests_waiting"]["type"],
        serde_json::json!("gauge")
    );
    assert_eq!(json["metrics"]["c"]["rate"], serde_json::json!(5.0));
    assert!(json["endpoints"][0].get("note").is_none());
    let back: ServerSection = serde_json::from_value(json).expect("deserialisable");
    assert_eq!(back, section);
}

#[test]
fn request_timeouts_are_clamped() {
    assert_eq!(
        request_timeout(Duration::from_millis(50)),
        Duration::from_secs(1)
    );
    assert_eq!(
        request_timeout(Duration::from_secs(2)),
        Duration::from_secs(2)
    );
    assert_eq!(
        request_timeout(Duration::from_secs(60)),
        Duration::from_secs(5)
    );
}

/// What a test server answers.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// Prometheus text, a counter growing by 10 per request.
    Metrics,
    /// An HTML page.
    Html,
    /// 404.
    NotFound,
    /// A body announced larger than [`MAX_BODY_BYTES`].
    Huge,
    /// A JSON body with no content type.
    Json,
    /// Metrics to the first `n` requests, then never an answer.
    HangAfter(u64),
}

/// A one-response-per-connection HTTP server on 127.0.0.1:0; returns its address and
/// the number of requests it has read.
async fn serve(answer: Answer) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let hits = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&hits);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let hits = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let n = hits.fetch_add(1, Ordering::SeqCst) + 1;
                let metrics = format!(
                    "# TYPE vllm:num_requests_waiting gauge\n\
                     vllm:num_requests_waiting{{model_name=\"m\"}} 3\n\
                     # TYPE vllm:prompt_tokens_total counter\n\
                     vllm:prompt_tokens_total{{model_name=\"m\"}} {}\n",
                    n * 10
                );
                let (status, content_type, body) = match answer {
                    Answer::Metrics => ("200 OK", "text/plain; version=0.0.4", metrics),
                    Answer::Html => ("200 OK", "text/html", "<html>hi</html>".to_owned()),
                    Answer::NotFound => ("404 Not Found", "text/plain", "not found".to_owned()),
                    Answer::Huge => {
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\
                             Content-Length: {}\r\nConnection: close\r\n\r\n",
                            MAX_BODY_BYTES + 1
                        );
                        let _ = socket.write_all(head.as_bytes()).await;
                        let _ = socket.write_all(metrics.as_bytes()).await;
                        return;
                    }
                    Answer::Json => ("200 OK", "", "{\"detail\":\"Not Found\"}".to_owned()),
                    Answer::HangAfter(limit) if n > limit => {
                        std::future::pending::<()>().await;
                        return;
                    }
                    Answer::HangAfter(_) => ("200 OK", "text/plain", metrics),
                };
                let content_type = if content_type.is_empty() {
                    String::new()
                } else {
                    format!("Content-Type: {content_type}\r\n")
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\n{content_type}\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (addr, hits)
}

fn endpoint(addr: SocketAddr) -> ScrapeEndpoint {
    ScrapeEndpoint::new(
        format!("http://{addr}/metrics"),
        vec![("authorization".to_owned(), "Bearer t".to_owned())],
    )
}

/// Wait (bounded) until `hits` reaches `at_least`.
async fn wait_for(hits: &AtomicU64, at_least: u64) {
    let patience = Instant::now() + Duration::from_secs(10);
    while hits.load(Ordering::SeqCst) < at_least {
        assert!(
            Instant::now() < patience,
            "the endpoint was not scraped in time"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn probes_scrapes_on_an_interval_and_drops_what_is_not_prometheus() {
    let (good, good_hits) = serve(Answer::Metrics).await;
    let (html, html_hits) = serve(Answer::Html).await;
    let (missing, _) = serve(Answer::NotFound).await;
    let refused = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("local addr")
    };
    let (huge, _) = serve(Answer::Huge).await;
    let (json, _) = serve(Answer::Json).await;
    let run_start = SystemTime::now();
    let scraper = Scraper::start(
        vec![
            endpoint(good),
            endpoint(html),
            endpoint(missing),
            endpoint(refused),
            endpoint(huge),
            endpoint(json),
        ],
        Duration::from_millis(50),
        &ScrapeClientOptions::default(),
    );
    // The probe and at least two scrapes on the interval.
    wait_for(&good_hits, 3).await;
    let log = scraper.finish().await;
    let run_end = SystemTime::now();
    let hits = good_hits.load(Ordering::SeqCst);
    assert!(
        hits >= 4,
        "probe, interval scrapes and the final one: {hits}"
    );
    assert_eq!(
        html_hits.load(Ordering::SeqCst),
        1,
        "dropped after the probe"
    );

    let section = log.section(run_start, run_end, run_start);
    let notes: Vec<Option<&str>> = section
        .endpoints
        .iter()
        .map(|endpoint| endpoint.note.as_deref())
        .collect();
    assert_eq!(notes[0], None);
    let scrapes = section.endpoints[0].scrapes;
    assert!((3..=hits).contains(&scrapes), "{scrapes} of {hits}");
    assert_eq!(
        notes[1],
        Some(format!("http://{html}/metrics: answered text/html, not Prometheus text").as_str())
    );
    assert_eq!(
        notes[2],
        Some(format!("http://{missing}/metrics: no Prometheus metrics (HTTP 404)").as_str())
    );
    let refused_note = notes[3].expect("refused endpoint noted");
    assert!(
        refused_note.starts_with(&format!("http://{refused}/metrics: could not be fetched: ")),
        "{refused_note}"
    );
    assert_eq!(section.endpoints[3].errors, 1);
    assert_eq!(
        notes[4],
        Some(format!("http://{huge}/metrics: answered more than 4 MiB").as_str())
    );
    assert_eq!(
        notes[5],
        Some(format!("http://{json}/metrics: not Prometheus text: looks like JSON").as_str())
    );
    assert_eq!(
        section.metrics.get("vllm:num_requests_waiting"),
        Some(&ServerMetric::Gauge {
            avg: 3.0,
            min: 3.0,
            max: 3.0,
            last: 3.0
        })
    );
    let Some(ServerMetric::Counter { delta, .. }) =
        section.metrics.get("vllm:prompt_tokens_total").copied()
    else {
        panic!("no counter: {section:?}");
    };
    assert_eq!(delta, 10.0 * (hits - 1) as f64);
    assert!(!section.timeline.is_empty());
}

#[tokio::test]
async fn a_hung_endpoint_does_not_hold_finish_beyond_its_timeout() {
    let (good, good_hits) = serve(Answer::Metrics).await;
    let (hung, hung_hits) = serve(Answer::HangAfter(1)).await;
    let never = {
        // Accepts connections (the kernel does) but never reads or answers.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        tokio::spawn(async move {
            let _listener = listener;
            std::future::pending::<()>().await;
        });
        addr
    };
    let interval = Duration::from_millis(50);
    let scraper = Scraper::start(
        vec![endpoint(good), endpoint(hung), endpoint(never)],
        interval,
        &ScrapeClientOptions::default(),
    );
    // The hung endpoint answered the probe and now hangs on a scrape.
    wait_for(&hung_hits, 2).await;
    let asked = Instant::now();
    let log = scraper.finish().await;
    let took = asked.elapsed();
    // Also what is left of the probe of `never` (one timeout from the start) at most.
    let bound = request_timeout(interval) * 2 + Duration::from_millis(500);
    assert!(took < bound, "finish took {took:?}");
    let section = log.section(SystemTime::UNIX_EPOCH, SystemTime::now(), SystemTime::now());
    let never_note = section.endpoints[2]
        .note
        .as_deref()
        .expect("never answered");
    assert!(
        never_note.ends_with("could not be fetched: no answer within 1000 ms"),
        "{never_note}"
    );
    assert_eq!(section.endpoints[1].note, None);
    assert!(section.endpoints[1].errors >= 1, "{section:?}");
    assert!(good_hits.load(Ordering::SeqCst) >= 2);
}

#[tokio::test]
async fn finishing_during_the_probe_waits_for_one_timeout_at_most() {
    let never = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        tokio::spawn(async move {
            let _listener = listener;
            std::future::pending::<()>().await;
        });
        addr
    };
    let interval = Duration::from_millis(50);
    let started = Instant::now();
    let scraper = Scraper::start(
        vec![endpoint(never)],
        interval,
        &ScrapeClientOptions::default(),
    );
    let log = scraper.finish().await;
    assert!(
        started.elapsed() < request_timeout(interval) + Duration::from_millis(500),
        "finish took {:?}",
        started.elapsed()
    );
    let section = log.section(SystemTime::UNIX_EPOCH, SystemTime::now(), SystemTime::now());
    assert_eq!(section.endpoints.len(), 1);
    assert!(section.endpoints[0].note.is_some());
    assert!(section.metrics.is_empty());
}

#[test]
fn scrapes_alternating_replicas_are_mixed_and_left_out() {
    let counter = |value: f64| families(&format!("# TYPE c_total counter\nc_total {value}\n"));
    // Through a balancer: replica A (1000 and growing), replica B (10 and growing) in turn.
    let alternating = log(
        1,
        [1000.0, 10.0, 1100.0, 20.0, 1200.0]
            .into_iter()
            .enumerate()
            .map(|(i, value)| (i as f64, vec![Some(counter(value))]))
            .collect(),
    );
    let section = alternating.section(at(0.0), at(4.0), at(0.0));
    let mixed = section.endpoints[0].mixed.as_deref().expect("named mixed");
    assert!(mixed.contains("backwards in 2 of 4 intervals"), "{mixed}");
    assert!(mixed.contains("c_total from 1000 to 10"), "{mixed}");
    assert!(!section.metrics.contains_key("c_total"), "{section:?}");
    assert_eq!(section.endpoints[0].scrapes, 5);

    // One server that restarted once: a reset, counted from zero, not mixed.
    let restarted = log(
        1,
        [100.0, 200.0, 5.0, 50.0]
            .into_iter()
            .enumerate()
            .map(|(i, value)| (i as f64, vec![Some(counter(value))]))
            .collect(),
    );
    let section = restarted.section(at(0.0), at(3.0), at(0.0));
    assert_eq!(section.endpoints[0].mixed, None);
    let Some(ServerMetric::Counter { delta, .. }) = section.metrics.get("c_total").copied() else {
        panic!("no counter: {section:?}");
    };
    assert!(close(delta, 100.0 + 5.0 + 45.0), "{delta}");
}

/// A server that answers `/metrics` with a 307 to `location` and `/metrics/` with
/// Prometheus text when the scrape's `authorization` header came along; the requests' paths
/// and whether each carried the header.
async fn redirecting(location: &'static str) -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                let authorized = head.contains("authorization: bearer t");
                log.lock()
                    .expect("log")
                    .push(format!("{path} {authorized}"));
                let response = if path == "/metrics" {
                    format!(
                        "HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\n\
                         Content-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                } else {
                    let body = "# TYPE g gauge\ng 1\n";
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn a_redirect_is_followed_within_the_origin_only() {
    // LiteLLM: `/metrics` → `/metrics/` on the same origin, with the endpoint's header.
    let (same, seen) = redirecting("/metrics/").await;
    let scraper = Scraper::start(
        vec![endpoint(same)],
        Duration::from_secs(10),
        &ScrapeClientOptions::default(),
    );
    let log = scraper.finish().await;
    let now = SystemTime::now();
    let section = log.section(now, now, now);
    assert_eq!(section.endpoints[0].note, None, "{section:?}");
    assert!(section.endpoints[0].scrapes >= 1, "{section:?}");
    assert!(section.metrics.contains_key("g"), "{section:?}");
    let paths = seen.lock().expect("log").clone();
    assert!(
        paths.contains(&"/metrics/ true".to_owned()),
        "followed with its header: {paths:?}"
    );

    // Another origin: not followed, the Location and the fix named.
    let (elsewhere, elsewhere_seen) = redirecting("/metrics/").await;
    let location: &'static str = Box::leak(format!("http://{elsewhere}/metrics/").into_boxed_str());
    let (cross, _) = redirecting(location).await;
    let scraper = Scraper::start(
        vec![endpoint(cross)],
        Duration::from_secs(10),
        &ScrapeClientOptions::default(),
    );
    let log = scraper.finish().await;
    let section = log.section(now, SystemTime::now(), now);
    let note = section.endpoints[0].note.clone().expect("a note");
    assert!(note.contains("HTTP 307 to http://"), "{note}");
    assert!(
        note.contains(&format!("--server-metrics {location}")),
        "{note}"
    );
    assert!(
        elsewhere_seen.lock().expect("log").is_empty(),
        "nothing reached the other origin"
    );
}

/// Generated tokens `value` as vLLM's counter.
fn generated(value: f64) -> Families {
    families(&format!(
        "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total {value}\n"
    ))
}

/// The 55×: the target's endpoint counted 7,700 generated tokens over a run that
/// received 140 — a balancer alternating replicas whose counters never stepped back in this
/// window. It is named mixed and its counter left out; the same counts against 7,000 tokens
/// received are one server's.
#[test]
fn the_targets_token_count_far_from_the_runs_is_mixed() {
    let mut log = log(
        1,
        vec![
            (0.0, vec![Some(generated(1_000.0))]),
            (1.0, vec![Some(generated(4_000.0))]),
            (2.0, vec![Some(generated(8_700.0))]),
        ],
    );
    log.endpoints[0].target = true;
    let section = log.section_against(at(0.0), at(2.0), at(0.0), Some(140.0));
    let mixed = section.endpoints[0].mixed.as_deref().expect("mixed");
    assert!(mixed.contains("7700 generated tokens"), "{mixed}");
    assert!(mixed.contains("55.0×"), "{mixed}");
    assert!(!section.metrics.contains_key("vllm:generation_tokens_total"));
    let agreeing = log.section_against(at(0.0), at(2.0), at(0.0), Some(7_000.0));
    assert_eq!(agreeing.endpoints[0].mixed, None);
    assert!(
        agreeing
            .metrics
            .contains_key("vllm:generation_tokens_total")
    );
    // Not the target's endpoint (another replica, a gateway): not compared.
    log.endpoints[0].target = false;
    let other = log.section_against(at(0.0), at(2.0), at(0.0), Some(140.0));
    assert_eq!(other.endpoints[0].mixed, None);
}
