//! `GET /metrics` against the mock's real state: the counts equal what its streams reported,
//! the gauges show the `--max-streams` queue as it is, the text is valid exposition format,
//! and every listener (HTTP/1.1, h2c, TLS with h2) serves it.

use std::collections::{BTreeMap, HashMap};

use super::*;

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed exposition text; parsing asserts the format line by line.
struct Exposition {
    samples: Vec<Sample>,
}

impl Exposition {
    /// Parse `text`, asserting: every line is `# HELP`, `# TYPE` or `name{labels} value`;
    /// every family has HELP and TYPE before its samples; counters end in `_total`; every
    /// sample carries `model_name`; histogram buckets are cumulative, non-decreasing, and the
    /// `+Inf` bucket equals `_count`.
    fn parse(text: &str) -> Exposition {
        assert!(text.ends_with('\n'), "ends with a newline");
        let mut help: HashMap<String, String> = HashMap::new();
        let mut kinds: HashMap<String, String> = HashMap::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, doc) = rest.split_once(' ').expect("HELP name text");
                assert!(!doc.is_empty(), "{line}");
                assert!(
                    help.insert(name.to_owned(), doc.to_owned()).is_none(),
                    "one HELP: {line}"
                );
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
                assert!(help.contains_key(name), "HELP before TYPE: {line}");
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                if kind == "counter" {
                    assert!(name.ends_with("_total"), "counter named _total: {line}");
                }
                assert!(
                    kinds.insert(name.to_owned(), kind.to_owned()).is_none(),
                    "{line}"
                );
                continue;
            }
            assert!(
                !line.starts_with('#') && !line.is_empty(),
                "stray line {line:?}"
            );
            let (series, value) = line.rsplit_once(' ').expect("name{labels} value");
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
            let (name, labels) = series.split_once('{').expect("labels");
            let labels = labels.strip_suffix('}').expect("labels end with }");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "metric name {name}"
            );
            let labels: BTreeMap<String, String> = labels
                .split("\",")
                .map(|pair| {
                    let (key, value) = pair.split_once("=\"").expect("label=\"value\"");
                    (key.to_owned(), value.trim_end_matches('"').to_owned())
                })
                .collect();
            assert!(labels.contains_key("model_name"), "{line}");
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|base| kinds.get(*base).is_some_and(|k| k == "histogram"))
                })
                .unwrap_or(name);
            assert!(kinds.contains_key(family), "TYPE before samples: {line}");
            samples.push(Sample {
                name: name.to_owned(),
                labels,
                value,
            });
        }
        let exposition = Exposition { samples };
        for (family, kind) in &kinds {
            if kind != "histogram" {
                continue;
            }
            let models: Vec<String> = exposition
                .samples
                .iter()
                .filter(|s| s.name == format!("{family}_count"))
                .map(|s| s.labels["model_name"].clone())
                .collect();
            assert!(!models.is_empty(), "{family} has series");
            for model in models {
                let buckets: Vec<&Sample> = exposition
                    .samples
                    .iter()
                    .filter(|s| {
                        s.name == format!("{family}_bucket") && s.labels["model_name"] == model
                    })
                    .collect();
                assert!(
                    buckets.windows(2).all(|w| w[0].value <= w[1].value),
                    "{family} {model}: cumulative buckets"
                );
                let bounds: Vec<f64> = buckets
                    .iter()
                    .map(|b| match b.labels["le"].as_str() {
                        "+Inf" => f64::INFINITY,
                        le => le.parse().expect("le"),
                    })
                    .collect();
                assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{family}: bounds");
                let last = buckets.last().expect("buckets");
                assert_eq!(last.labels["le"], "+Inf", "{family}");
                let count = exposition.value(&format!("{family}_count"), &model);
                assert_eq!(last.value, count, "{family} {model}: +Inf == count");
            }
        }
        exposition
    }

    /// The value of `name` for `model` (summed over other labels).
    fn value(&self, name: &str, model: &str) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && s.labels["model_name"] == model)
            .map(|s| s.value)
            .sum()
    }

    /// The value of `name` summed over every series.
    fn total(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    }

    fn with_label(&self, name: &str, label: &str, value: &str) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name && s.labels.get(label).is_some_and(|v| v == value))
            .map(|s| s.value)
            .sum()
    }
}

/// Scrape over HTTP/1.1, asserting the status and content type.
async fn scrape(addr: SocketAddr) -> Exposition {
    let response = request(addr, "GET", "/metrics", &[], "").await;
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    Exposition::parse(&response.text())
}

/// The usage an OpenAI SSE stream reported: (prompt, completion) tokens.
fn sse_usage(text: &str) -> (u64, u64) {
    let usage = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .rfind(|v| v["usage"].is_object())
        .unwrap_or_else(|| panic!("a usage chunk in {text}"));
    (
        usage["usage"]["prompt_tokens"].as_u64().expect("prompt"),
        usage["usage"]["completion_tokens"]
            .as_u64()
            .expect("completion"),
    )
}

fn chat(model: &str, max_tokens: u64, prompt: &str) -> String {
    format!(
        r#"{{"model":"{model}","stream":true,"max_tokens":{max_tokens},"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"{prompt}"}}]}}"#
    )
}

#[tokio::test]
async fn metrics_count_exactly_what_the_streams_reported() {
    let log = temp_path("metrics-requests.jsonl");
    let server = Server::start(MockConfig {
        tokens: None,
        request_log: Some(log.clone()),
        ..fast()
    })
    .await;
    // Before any request: every family, with the default model's series at zero.
    let empty = scrape(server.addr).await;
    assert_eq!(empty.value("vllm:num_requests_running", "mock-model"), 0.0);
    assert_eq!(empty.total("vllm:time_to_first_token_seconds_count"), 0.0);
    assert_eq!(empty.total("vllm:num_preemptions_total"), 0.0);

    let mut prompt = 0;
    let mut completion = 0;
    let mut by_model: HashMap<&str, u64> = HashMap::new();
    for (model, max_tokens, text) in [
        ("alpha", 3, "abcdefgh"),
        ("alpha", 5, "abcdefghijklmnop"),
        ("beta", 7, "hi"),
    ] {
        let response = request(
            server.addr,
            "POST",
            "/v1/chat/completions",
            &[],
            &chat(model, max_tokens, text),
        )
        .await;
        assert_eq!(response.status, 200);
        let (p, c) = sse_usage(&response.text());
        assert_eq!(c, max_tokens);
        prompt += p;
        completion += c;
        *by_model.entry(model).or_default() += c;
    }
    // A non-streamed answer: its tokens are written with its one body.
    let whole = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        r#"{"model":"beta","messages":[{"role":"user","content":"abcd"}]}"#,
    )
    .await;
    let whole: serde_json::Value = serde_json::from_slice(&whole.body()).expect("json");
    prompt += whole["usage"]["prompt_tokens"].as_u64().expect("prompt");
    let whole_tokens = whole["usage"]["completion_tokens"]
        .as_u64()
        .expect("completion");
    completion += whole_tokens;
    *by_model.entry("beta").or_default() += whole_tokens;
    // Not model requests: neither counted nor timed.
    assert_eq!(
        request(server.addr, "POST", "/v2/nothing", &[], "{}")
            .await
            .status,
        404
    );
    assert_eq!(
        request(server.addr, "GET", "/nothing", &[], "")
            .await
            .status,
        404
    );

    let metrics = scrape(server.addr).await;
    assert_eq!(
        metrics.total("vllm:generation_tokens_total"),
        completion as f64
    );
    assert_eq!(metrics.total("vllm:prompt_tokens_total"), prompt as f64);
    for (model, tokens) in &by_model {
        assert_eq!(
            metrics.value("vllm:generation_tokens_total", model),
            *tokens as f64,
            "{model}"
        );
    }
    assert_eq!(
        metrics.value("vllm:time_to_first_token_seconds_count", "alpha"),
        2.0
    );
    assert_eq!(
        metrics.value("vllm:time_to_first_token_seconds_count", "beta"),
        2.0
    );
    assert_eq!(metrics.total("vllm:e2e_request_latency_seconds_count"), 4.0);
    // Every stream ran to its max_tokens (finish "length"); the whole body stopped on its own.
    assert_eq!(
        metrics.with_label("vllm:request_success_total", "finished_reason", "length"),
        3.0
    );
    assert_eq!(
        metrics.with_label("vllm:request_success_total", "finished_reason", "stop"),
        1.0
    );
    // `fast()`: TTFT 5 ms, so every first token is past the 5 ms bound, and under a second.
    let ttft_sum = metrics.total("vllm:time_to_first_token_seconds_sum");
    assert!((0.02..4.0).contains(&ttft_sum), "{ttft_sum}");
    assert_eq!(
        metrics.with_label("vllm:time_to_first_token_seconds_bucket", "le", "0.001"),
        0.0
    );
    assert_eq!(metrics.total("vllm:num_requests_running"), 0.0);
    assert_eq!(metrics.total("vllm:num_requests_waiting"), 0.0);
    assert_eq!(metrics.total("vllm:kv_cache_usage_perc"), 0.0, "no cap: 0");
    server.shutdown().await;
    let logged = std::fs::read_to_string(&log).expect("request log");
    assert!(
        !logged.contains("/metrics"),
        "scrapes are not logged: {logged}"
    );
    assert_eq!(logged.lines().count(), 6, "{logged}");
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn metrics_show_running_and_waiting_under_max_streams() {
    let server = Server::start(MockConfig {
        max_streams: Some(1),
        ttft: Duration::from_millis(200),
        itl: Duration::from_millis(5),
        tokens: Some(4),
        ..MockConfig::default()
    })
    .await;
    let addr = server.addr;
    let body = chat("m", 64, "hello");
    let streams: Vec<_> = (0..3)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(
                async move { request(addr, "POST", "/v1/chat/completions", &[], &body).await },
            )
        })
        .collect();
    // Bounded patience: until all three have arrived (one running, two queued).
    let mut max_running = 0.0f64;
    let mut seen_full = false;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let metrics = scrape(addr).await;
        let running = metrics.value("vllm:num_requests_running", "m");
        let waiting = metrics.value("vllm:num_requests_waiting", "m");
        max_running = max_running.max(running);
        if running == 1.0 && waiting == 2.0 {
            assert_eq!(metrics.value("vllm:kv_cache_usage_perc", "m"), 1.0);
            seen_full = true;
            break;
        }
        // Poll gently: tests that time frames to the millisecond share the machine.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(seen_full, "a scrape showed 1 running and 2 waiting");
    let mut completion = 0;
    for stream in streams {
        // Scrape while they finish, too: never more running than slots.
        let metrics = scrape(addr).await;
        max_running = max_running.max(metrics.total("vllm:num_requests_running"));
        let response = stream.await.expect("stream");
        assert_eq!(response.status, 200);
        completion += sse_usage(&response.text()).1;
    }
    assert!(max_running <= 1.0, "{max_running}");
    let metrics = scrape(addr).await;
    assert_eq!(
        metrics.total("vllm:generation_tokens_total"),
        completion as f64
    );
    assert_eq!(
        metrics.value("vllm:time_to_first_token_seconds_count", "m"),
        3.0
    );
    assert_eq!(metrics.total("vllm:num_requests_running"), 0.0);
    assert_eq!(metrics.total("vllm:num_requests_waiting"), 0.0);
    assert_eq!(metrics.total("vllm:kv_cache_usage_perc"), 0.0);
    // TTFT counts from arrival, queue included: the third waited for two whole streams, so
    // the TTFT sum is at least 200 + 415 + 630 ms.
    let ttft_sum = metrics.value("vllm:time_to_first_token_seconds_sum", "m");
    assert!(ttft_sum >= 1.2, "{ttft_sum}");
    server.shutdown().await;
}

#[tokio::test]
async fn fail_rate_never_fails_a_scrape_and_failures_are_not_counted() {
    let server = Server::start(MockConfig {
        faults: FaultConfig {
            fail_rate: 1.0,
            ..fast().faults
        },
        ..fast()
    })
    .await;
    let failed = request(server.addr, "POST", "/v1/chat/completions", &[], CHAT).await;
    assert_eq!(failed.status, 500);
    for _ in 0..3 {
        let metrics = scrape(server.addr).await;
        assert_eq!(metrics.total("vllm:generation_tokens_total"), 0.0);
        assert_eq!(metrics.total("vllm:prompt_tokens_total"), 0.0);
        assert_eq!(metrics.total("vllm:request_success_total"), 0.0);
        assert_eq!(metrics.total("vllm:time_to_first_token_seconds_count"), 0.0);
    }
    server.shutdown().await;
}

#[tokio::test]
async fn metrics_follow_recorded_mode_with_the_recorded_usage() {
    let path = temp_path("metrics-recording.jsonl");
    let chunk = |content: &str| {
        format!(
            "data: {}\n\n",
            serde_json::json!({"choices": [{"index": 0, "delta": {"content": content}}]})
        )
    };
    let usage = format!(
        "data: {}\n\ndata: [DONE]\n\n",
        serde_json::json!({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5}})
    );
    let line = serde_json::json!({
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": "{\"model\":\"rec\"}"},
        "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
                     "frames": [{"t_ms": 10.0, "data": chunk("a")}, {"t_ms": 12.0, "data": chunk("b")},
                                {"t_ms": 14.0, "data": chunk("c")}, {"t_ms": 16.0, "data": usage}]}
    });
    std::fs::write(&path, format!("{line}\n")).expect("write recording");
    let server = Server::start(MockConfig {
        recording: Some(Arc::new(Recorded::load(&path).expect("load"))),
        ..fast()
    })
    .await;
    for _ in 0..2 {
        let response = request(
            server.addr,
            "POST",
            "/v1/chat/completions",
            &[(EXCHANGE_HEADER, "0")],
            "{\"model\":\"rec\"}",
        )
        .await;
        assert_eq!(response.status, 200);
        assert_eq!(sse_usage(&response.text()), (11, 5));
    }
    let metrics = scrape(server.addr).await;
    // Three content frames share the five tokens the recording reports.
    assert_eq!(metrics.value("vllm:generation_tokens_total", "rec"), 10.0);
    assert_eq!(metrics.value("vllm:prompt_tokens_total", "rec"), 22.0);
    assert_eq!(
        metrics.value("vllm:time_to_first_token_seconds_count", "rec"),
        2.0
    );
    assert_eq!(
        metrics.with_label("vllm:request_success_total", "finished_reason", "stop"),
        2.0
    );
    let ttft_sum = metrics.value("vllm:time_to_first_token_seconds_sum", "rec");
    assert!(
        ttft_sum >= 0.02,
        "recorded first token at 10 ms, twice: {ttft_sum}"
    );
    server.shutdown().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn model_names_are_bounded_and_the_rest_folded_into_other() {
    let server = Server::start(fast()).await;
    for i in 0..20 {
        let response = request(
            server.addr,
            "POST",
            "/v1/chat/completions",
            &[],
            &chat(&format!("model-{i}\\\"x"), 4, "hi"),
        )
        .await;
        assert_eq!(response.status, 200);
    }
    let text = request(server.addr, "GET", "/metrics", &[], "")
        .await
        .text();
    let metrics = Exposition::parse(&text);
    let models: std::collections::BTreeSet<&str> = metrics
        .samples
        .iter()
        .map(|s| s.labels["model_name"].as_str())
        .collect();
    // mock-model (present from the start) + 15 named + other.
    assert_eq!(
        models.len(),
        crate::metrics::MAX_MODEL_NAMES + 1,
        "{models:?}"
    );
    assert!(models.contains("other"));
    assert!(text.contains(r#"model_name="model-0\"x""#), "label escaped");
    assert_eq!(
        metrics.total("vllm:time_to_first_token_seconds_count"),
        20.0
    );
    assert_eq!(
        metrics.value("vllm:time_to_first_token_seconds_count", "other"),
        5.0
    );
    server.shutdown().await;
}

/// GET /metrics over HTTP/2 on `io`: status, content type, body.
async fn h2_scrape<I>(io: I) -> (u16, String, String)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(io),
    )
    .await
    .expect("h2 handshake");
    let driver = tokio::spawn(connection);
    let request = Request::get("http://127.0.0.1/metrics")
        .body(http_body_util::Empty::<Bytes>::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("h2 response");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("h2 body")
        .to_bytes();
    drop(sender);
    driver.abort();
    (
        status,
        content_type,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test]
async fn every_listener_serves_metrics_h2c_and_tls_with_h2() {
    // Cleartext HTTP/2 with prior knowledge.
    let server = Server::start(fast()).await;
    let (status, content_type, text) =
        h2_scrape(TcpStream::connect(server.addr).await.expect("connect")).await;
    assert_eq!(status, 200);
    assert_eq!(content_type, crate::metrics::CONTENT_TYPE);
    Exposition::parse(&text);
    server.shutdown().await;

    // TLS, h2 by ALPN.
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let server_key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server_tls = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], server_key)
        .expect("server config");
    server_tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let server = Server::start(MockConfig {
        tls: Some(Arc::new(server_tls)),
        ..fast()
    })
    .await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).expect("root");
    let mut client_tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    client_tls.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_tls));
    let tcp = TcpStream::connect(server.addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = connector.connect(name, tcp).await.expect("TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (status, content_type, text) = h2_scrape(tls).await;
    assert_eq!(status, 200);
    assert_eq!(content_type, crate::metrics::CONTENT_TYPE);
    let metrics = Exposition::parse(&text);
    assert_eq!(metrics.total("vllm:num_requests_running"), 0.0);
    server.shutdown().await;
}

#[test]
fn mock_help_mentions_the_metrics_endpoint() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }
    #[derive(clap::Subcommand)]
    enum Command {
        /// Mock LLM server speaking all four response families.
        Mock(MockArgs),
    }
    use clap::CommandFactory as _;
    let mut cli = Cli::command();
    let help = cli
        .find_subcommand_mut("mock")
        .expect("mock")
        .render_long_help()
        .to_string();
    assert!(help.contains("GET /metrics"), "{help}");
    assert!(help.contains("vllm:num_requests_waiting"), "{help}");
}
