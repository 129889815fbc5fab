//! `--health-listen ADDR`: `/healthz` (the process is alive), `/readyz` (200 once every
//! upstream answered a request, or a TCP probe to it connected; 503 before, naming those not
//! reached) and `/metrics`
//! (Prometheus text of [`crate::metrics::RecordMetrics`]), on a listener of their own so an
//! orchestrator's probes never reach the upstream or the recording.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use tokio::net::TcpListener;

use common::accept;

use crate::RecordError;
use crate::proxy::ProxyState;

/// The time a probe gets to send its request head (first byte included).
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Probes served at once (by `common::accept`); more wait in the kernel's backlog.
const LIMITS: accept::AcceptLimits = accept::AcceptLimits {
    name: "--health-listen",
    max_connections: 64,
    head_timeout: Some(HEAD_TIMEOUT),
};

/// Bind `address` and serve until the returned task is aborted; a readiness probe of the
/// upstream runs beside it until the upstream is reached. The tasks hold the proxy's state
/// weakly: they never keep the writer open past the proxy's end.
pub async fn start(
    address: &str,
    state: &Arc<ProxyState>,
) -> Result<tokio::task::JoinHandle<()>, RecordError> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| RecordError::Usage(format!("--health-listen {address}: {e}")))?;
    if let Ok(bound) = listener.local_addr() {
        tracing::info!(address = %bound, "health, readiness and metrics endpoint listening");
    }
    let state = Arc::downgrade(state);
    Ok(tokio::spawn(async move {
        tokio::spawn(probe_upstream(state.clone()));
        let builder = accept::http_builder(HEAD_TIMEOUT);
        // Runs until aborted: the connections go with it.
        let _connections = accept::serve(
            listener,
            &LIMITS,
            std::future::pending(),
            move |stream, _peer| {
                let state = state.clone();
                let builder = builder.clone();
                async move {
                    let service = service_fn(move |request| answer(state.clone(), request));
                    let _ = builder
                        .serve_connection(accept::http_io(stream, HEAD_TIMEOUT), service)
                        .await;
                }
            },
        )
        .await;
    }))
}

/// Connect to each upstream not reached yet, every second, until every one has accepted
/// (or answered a request).
async fn probe_upstream(weak: Weak<ProxyState>) {
    let Some(state) = weak.upgrade() else { return };
    let targets: Vec<(String, String)> = state
        .routes
        .iter()
        .map(|route| (route.name.clone(), route.upstream.socket_address()))
        .collect();
    drop(state);
    while let Some(metrics) = weak.upgrade().map(|s| s.metrics.clone()) {
        let waiting = metrics.unready_upstreams();
        if metrics.ready.load(Ordering::Relaxed) || waiting.is_empty() {
            break;
        }
        for (name, target) in targets.iter().filter(|(name, _)| waiting.contains(name)) {
            let connect = tokio::net::TcpStream::connect(target);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), connect).await {
                metrics.upstream_ready(name);
            }
        }
        if metrics.ready.load(Ordering::Relaxed) {
            break;
        }
        drop(metrics);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The `/readyz` answer before every upstream was reached: which ones were not.
fn not_ready(state: &ProxyState) -> String {
    let waiting = state.metrics.unready_upstreams();
    let named: Vec<String> = state
        .routes
        .iter()
        .filter(|route| waiting.contains(&route.name))
        .map(|route| format!("{} ({})", route.name, route.upstream.display()))
        .collect();
    format!(
        "not ready: no answer yet from the upstream {}\n",
        named.join(", ")
    )
}

async fn answer(
    weak: Weak<ProxyState>,
    request: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let Some(state) = weak.upgrade() else {
        let mut response = http::Response::new(Full::new(Bytes::from_static(b"stopping\n")));
        *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        return Ok(response);
    };
    let (status, content_type, body) = match request.uri().path() {
        "/healthz" | "/livez" => (200, "text/plain", "ok\n".to_owned()),
        "/readyz" if state.metrics.ready.load(Ordering::Relaxed) => {
            (200, "text/plain", "ready\n".to_owned())
        }
        "/readyz" => (503, "text/plain", not_ready(&state)),
        "/metrics" => (
            200,
            "text/plain; version=0.0.4",
            state.metrics.render(state.in_flight.load(Ordering::SeqCst)),
        ),
        _ => (
            404,
            "text/plain",
            "not found: /healthz, /readyz, /metrics\n".to_owned(),
        ),
    };
    let mut response = http::Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or_default();
    if let Ok(value) = http::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    Ok(response)
}
