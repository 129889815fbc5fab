//! `llm-replay-test-gateway`: a small forwarding gateway for the capacity tests, a real
//! process in front of a model server, as LiteLLM's proxy is in front of vLLM.
//!
//! It forwards every request to `--upstream` (method, path, headers, body; the response
//! streamed back as it arrives), lets at most `--limit` requests through at once (the rest
//! wait in arrival order: the gateway's own concurrency limit, e.g. a `max_parallel_requests`)
//! and answers `GET /metrics` with the metric families LiteLLM's proxy exposes, under
//! their real names (`litellm/types/integrations/prometheus.py`, `DEFINED_PROMETHEUS_METRICS`;
//! the in-flight gauge is `litellm/proxy/middleware/in_flight_requests_middleware.py`'s;
//! the buckets are that file's `LATENCY_BUCKETS`):
//!
//! - `litellm_in_flight_requests` (gauge): requests in the gateway, waiting or forwarded;
//! - `litellm_request_queue_time_seconds` (histogram): arrival → dispatch upstream;
//! - `litellm_request_total_latency_metric` (histogram, seconds): arrival → response end;
//! - `litellm_proxy_total_requests_metric` (counter): requests answered.
//!
//! `--slow-request N --slow-by D` holds the N-th request (1-based, scrapes not counted) D
//! before dispatching it: one slow answer, injected exactly.
//!
//! Usage: `llm-replay-test-gateway --upstream http://HOST:PORT [--listen ADDR] [--limit N]
//! [--slow-request N --slow-by MS]`; prints `gateway listening on http://ADDR` when ready.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// LiteLLM's `LATENCY_BUCKETS` (seconds), `+Inf` implied.
const BUCKETS: &[f64] = &[
    0.005, 0.00625, 0.0125, 0.025, 0.05, 0.1, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0,
    5.5, 6.0, 6.5, 7.0, 7.5, 8.0, 8.5, 9.0, 9.5, 10.0, 15.0, 20.0, 25.0, 30.0, 60.0, 120.0, 180.0,
    240.0, 300.0,
];

type Body = BoxBody<Bytes, std::io::Error>;

/// A Prometheus histogram of seconds.
struct Histogram {
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: BUCKETS.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }

    fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            out.push_str(&format!(
                "{name}_bucket{{le=\"{bound}\"}} {}\n",
                bucket.load(Ordering::Relaxed)
            ));
        }
        let count = self.count.load(Ordering::Relaxed);
        out.push_str(&format!("{name}_bucket{{le=\"+Inf\"}} {count}\n"));
        out.push_str(&format!("{name}_count {count}\n"));
        out.push_str(&format!(
            "{name}_sum {}\n",
            self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
        ));
    }
}

/// The gateway's options and state.
struct Gateway {
    upstream: String,
    client: reqwest::Client,
    slots: Option<Arc<Semaphore>>,
    slow: Option<(u64, Duration)>,
    arrived: AtomicU64,
    answered: AtomicU64,
    in_flight: AtomicI64,
    queue_time: Histogram,
    latency: Histogram,
}

impl Gateway {
    fn metrics(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "# HELP litellm_in_flight_requests Number of HTTP requests currently in-flight on this uvicorn worker\n# TYPE litellm_in_flight_requests gauge\nlitellm_in_flight_requests {}\n",
            self.in_flight.load(Ordering::Relaxed)
        ));
        self.queue_time.render(
            "litellm_request_queue_time_seconds",
            "Time a request waits in the proxy before dispatch",
            &mut out,
        );
        self.latency.render(
            "litellm_request_total_latency_metric",
            "Total latency (seconds) for a request to LiteLLM",
            &mut out,
        );
        out.push_str(&format!(
            "# HELP litellm_proxy_total_requests_metric Total number of requests made to the proxy server\n# TYPE litellm_proxy_total_requests_metric counter\nlitellm_proxy_total_requests_metric_total {}\n",
            self.answered.load(Ordering::Relaxed)
        ));
        out
    }
}

fn full(status: u16, text: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(text))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = hyper::StatusCode::from_u16(status).expect("a valid status");
    response
}

/// One request: `/metrics`, or forwarded once a slot is free.
async fn handle(gateway: Arc<Gateway>, request: Request<Incoming>) -> Response<Body> {
    if request.uri().path() == "/metrics" {
        return full(200, gateway.metrics());
    }
    let arrival = Instant::now();
    let index = gateway.arrived.fetch_add(1, Ordering::Relaxed) + 1;
    gateway.in_flight.fetch_add(1, Ordering::Relaxed);
    let permit = match &gateway.slots {
        Some(slots) => Some(
            slots
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed"),
        ),
        None => None,
    };
    gateway.queue_time.observe(arrival.elapsed());
    if let Some((slow, by)) = gateway.slow
        && slow == index
    {
        tokio::time::sleep(by).await;
    }
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut upstream = gateway
        .client
        .request(parts.method, format!("{}{path}", gateway.upstream))
        .body(body);
    for (name, value) in &parts.headers {
        if !matches!(name.as_str(), "host" | "content-length" | "connection") {
            upstream = upstream.header(name, value);
        }
    }
    let answer = match upstream.send().await {
        Ok(answer) => answer,
        Err(error) => {
            drop(permit);
            finished(&gateway, arrival);
            return full(502, format!("upstream: {error}"));
        }
    };
    let mut response = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if !matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            response = response.header(name, value);
        }
    }
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(16);
    let streaming = gateway.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let mut answer = answer;
        loop {
            match answer.chunk().await {
                Ok(Some(chunk)) => {
                    if tx.send(Ok(Frame::data(chunk))).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    let _ = tx.send(Err(std::io::Error::other(error))).await;
                    break;
                }
            }
        }
        finished(&streaming, arrival);
    });
    response
        .body(StreamBody::new(ReceiverStream::new(rx)).boxed())
        .unwrap_or_else(|error| full(502, format!("response: {error}")))
}

fn finished(gateway: &Gateway, arrival: Instant) {
    gateway.latency.observe(arrival.elapsed());
    gateway.answered.fetch_add(1, Ordering::Relaxed);
    gateway.in_flight.fetch_sub(1, Ordering::Relaxed);
}

/// `--name value` pairs.
fn option(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn number(args: &[String], name: &str) -> Option<u64> {
    option(args, name).map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} {v:?}: expected a whole number"))
    })
}

#[tokio::main]
async fn main() {
    // reqwest's rustls needs a provider even for cleartext upstreams.
    fixtures::install_crypto_provider();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let upstream = option(&args, "--upstream")
        .expect("--upstream URL is required")
        .trim_end_matches('/')
        .to_owned();
    let listen: SocketAddr = option(&args, "--listen")
        .unwrap_or_else(|| "127.0.0.1:0".to_owned())
        .parse()
        .expect("--listen ADDR");
    let limit = number(&args, "--limit").unwrap_or(0) as usize;
    let slow = number(&args, "--slow-request").map(|n| {
        (
            n,
            Duration::from_millis(number(&args, "--slow-by").unwrap_or(2000)),
        )
    });
    let gateway = Arc::new(Gateway {
        upstream,
        client: reqwest::Client::new(),
        slots: (limit > 0).then(|| Arc::new(Semaphore::new(limit))),
        slow,
        arrived: AtomicU64::new(0),
        answered: AtomicU64::new(0),
        in_flight: AtomicI64::new(0),
        queue_time: Histogram::new(),
        latency: Histogram::new(),
    });
    let listener = TcpListener::bind(listen).await.expect("bind --listen");
    let addr = listener.local_addr().expect("the bound address");
    println!("gateway listening on http://{addr}");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        // As uvicorn does for LiteLLM: without it, each stream's second write waits for
        // the client's delayed ACK (40 ms on Linux), which a TTFT goal would charge to the
        // server.
        let _ = stream.set_nodelay(true);
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let gateway = gateway.clone();
                async move { Ok::<_, Infallible>(handle(gateway, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
