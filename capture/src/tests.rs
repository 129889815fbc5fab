//! The proxy against an https upstream: TLS with a private CA (`--upstream-ca`) and HTTP/2
//! negotiated by ALPN, checked from the upstream's side.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::proxy::Upstream;
use super::routes::Routes;
use super::writer::Scrub;
use super::{RecordConfig, run};

const SSE: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";

/// An https upstream with a fresh self-signed certificate for `localhost`; returns its port,
/// the certificate's PEM and the HTTP versions of the requests it served.
async fn tls_upstream() -> (u16, String, Arc<Mutex<Vec<http::Version>>>) {
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocols")
    .with_no_client_auth()
    .with_single_cert(vec![certified.cert.der().clone()], key)
    .expect("server config");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let versions = Arc::new(Mutex::new(Vec::new()));
    let seen = versions.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    seen.lock().expect("lock").push(request.version());
                    async move {
                        let mut response =
                            http::Response::new(Full::new(Bytes::from_static(SSE.as_bytes())));
                        response.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("text/event-stream"),
                        );
                        // A gateway naming its internal upstream (LiteLLM does).
                        response.headers_mut().insert(
                            "x-litellm-model-api-base",
                            http::HeaderValue::from_static("http://vllm-3.internal:8000/v1"),
                        );
                        response
                            .headers_mut()
                            .insert("x-request-id", http::HeaderValue::from_static("req-42"));
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, certified.cert.pem(), versions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_through_a_tls_upstream_over_http2() {
    let (port, pem, versions) = tls_upstream().await;
    let dir = std::env::temp_dir().join(format!("llm-replay-capture-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, pem).expect("ca");
    let out = dir.join("recorded.jsonl");
    let config = RecordConfig {
        routes: Routes::single(Upstream::parse(&format!("https://localhost:{port}")).expect("url")),
        out: out.clone(),
        scrub: Scrub::default(),
        session_header: None,
        upstream_h2c: false,
        upstream_ca: Some(ca.clone()),
        drain: Duration::from_secs(5),
        max_recorded_bytes: super::DEFAULT_MAX_RECORDED_BYTES,
        upstream_idle_timeout: super::DEFAULT_UPSTREAM_IDLE_TIMEOUT,
        health: Default::default(),
        recording: Default::default(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let proxy = tokio::spawn(run(listener, config, async {
        let _ = stopped.await;
    }));

    let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.expect("send");
    let mut received = Vec::new();
    client.read_to_end(&mut received).await.expect("read");
    let received = String::from_utf8_lossy(&received);
    assert!(received.starts_with("HTTP/1.1 200"), "{received}");
    assert!(received.contains("data: [DONE]"), "{received}");
    // The client gets the upstream's headers unchanged...
    assert!(
        received.contains("x-litellm-model-api-base: http://vllm-3.internal:8000/v1"),
        "{received}"
    );
    let _ = stop.send(());
    let summary = proxy.await.expect("task").expect("proxy ran");
    assert_eq!(summary.written, 1);

    assert_eq!(*versions.lock().expect("lock"), vec![http::Version::HTTP_2]);
    let recorded = common::recording::read_all(&out).expect("readable");
    let response = recorded[0].response.as_ref().expect("response");
    assert!(response.complete && response.has_timing());
    // ...the recording leaves out the one naming another host, and keeps the rest.
    assert_eq!(response.header("x-litellm-model-api-base"), None);
    assert_eq!(response.header("x-request-id"), Some("req-42"));
    assert!(
        !std::fs::read_to_string(&out)
            .expect("recording")
            .contains("vllm-3.internal")
    );
    let text: Vec<u8> = response
        .frames
        .iter()
        .flat_map(|f| f.bytes().into_owned())
        .collect();
    assert_eq!(text, SSE.as_bytes());

    // Without the private CA the certificate is refused: 502 to the client, recorded error.
    let untrusted = super::upstream::upstream_client(false, None).expect("client");
    let uri: http::Uri = format!("https://localhost:{port}/v1/models")
        .parse()
        .expect("uri");
    let result = untrusted
        .request(
            http::Request::get(uri)
                .body(Full::new(Bytes::new()))
                .expect("request"),
        )
        .await;
    assert!(
        result.is_err(),
        "a self-signed certificate must not be trusted by default"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sizes_read_with_and_without_units() {
    use super::parse_size;
    assert_eq!(parse_size("1048576"), Ok(1 << 20));
    assert_eq!(parse_size("16MiB"), Ok(16 << 20));
    assert_eq!(parse_size("16 mib"), Ok(16 << 20));
    assert_eq!(parse_size("500KB"), Ok(500_000));
    assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    assert_eq!(parse_size("0"), Ok(0));
    for bad in [
        "",
        "MiB",
        "1.5MiB",
        "16 parsecs",
        "-1",
        "99999999999999999999GiB",
    ] {
        let error = parse_size(bad).expect_err(bad);
        assert!(error.contains("invalid size"), "{bad}: {error}");
    }
}

/// A client that reads three frames of a slow stream and closes its socket: the recording
/// says when, on the frames' clock (`cancelled_ms`), as the proxy noticed it, and the replay
/// reads it back (`Exchange::client_cancelled_ms`). hyper notices a client closing
/// mid-response at once (a read of 0 while the body waits), not at the next frame's write:
/// the upstream's frames are 60 ms apart, and the recorded instant must be within 2 ms of
/// the client's own `close − send` (both read on this process's monotonic clock; the 2 ms
/// bound covers the proxy's receive-to-forward time on one side and its notice time on the
/// other, both well under a millisecond on loopback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_stream_is_recorded_with_when() {
    const TOLERANCE_MS: f64 = 2.0;
    let _timing = common::test_timing::timing_lock().await;
    let upstream = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream_addr = upstream.local_addr().expect("addr");
    let (stop_mock, mock_stopped) = tokio::sync::oneshot::channel::<()>();
    let mock = tokio::spawn(mock::serve(
        upstream,
        mock::MockConfig {
            ttft: Duration::from_millis(5),
            itl: Duration::from_millis(60),
            tokens: Some(40),
            ..mock::MockConfig::default()
        },
        async {
            let _ = mock_stopped.await;
        },
    ));

    let dir =
        std::env::temp_dir().join(format!("llm-replay-capture-cancel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let out = dir.join("recorded.jsonl");
    let config = RecordConfig {
        routes: Routes::single(Upstream::parse(&format!("http://{upstream_addr}")).expect("url")),
        out: out.clone(),
        scrub: Scrub::default(),
        session_header: None,
        upstream_h2c: false,
        upstream_ca: None,
        drain: Duration::from_secs(5),
        max_recorded_bytes: super::DEFAULT_MAX_RECORDED_BYTES,
        upstream_idle_timeout: super::DEFAULT_UPSTREAM_IDLE_TIMEOUT,
        health: Default::default(),
        recording: Default::default(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let proxy = tokio::spawn(run(listener, config, async {
        let _ = stopped.await;
    }));

    let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
    client.set_nodelay(true).expect("nodelay");
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.expect("send");
    let sent = std::time::Instant::now();
    // The role frame and two tokens: three SSE events.
    let mut received = Vec::new();
    let mut read = [0u8; 4096];
    while received.windows(6).filter(|w| w == b"data: ").count() < 3 {
        let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut read))
            .await
            .expect("frames within 5 s")
            .expect("read");
        assert!(n > 0, "the stream ended early");
        received.extend_from_slice(&read[..n]);
    }
    let closed_ms = sent.elapsed().as_nanos() as f64 / 1e6;
    drop(client);

    // The cut stream is handed to the writer at once; stopping the proxy writes it out.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _ = stop.send(());
    let summary = proxy.await.expect("task").expect("proxy ran");
    assert_eq!(summary.written, 1);
    let _ = stop_mock.send(());
    mock.await.expect("mock task").expect("mock ran");

    let recorded = common::recording::read_all(&out).expect("readable");
    let exchange = &recorded[0];
    let response = exchange.response.as_ref().expect("response");
    assert!(!response.complete);
    assert_eq!(
        response.unknown.get("ended"),
        Some(&serde_json::json!("client disconnected"))
    );
    let cancelled_ms = response
        .unknown
        .get("cancelled_ms")
        .and_then(serde_json::Value::as_f64)
        .expect("cancelled_ms recorded");
    // µs resolution, like the frames'.
    assert_eq!((cancelled_ms * 1000.0).round() / 1000.0, cancelled_ms);
    let last_frame_ms = response.frames.last().and_then(|f| f.t_ms).expect("frames");
    assert!(
        cancelled_ms >= last_frame_ms,
        "{cancelled_ms} < {last_frame_ms}"
    );
    assert!(
        (cancelled_ms - closed_ms).abs() <= TOLERANCE_MS,
        "recorded the hang-up at {cancelled_ms} ms, the client closed at {closed_ms} ms"
    );
    assert_eq!(exchange.client_cancelled_ms(), Some(cancelled_ms));
    std::fs::remove_dir_all(&dir).ok();
}
