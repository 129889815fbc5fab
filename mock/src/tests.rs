//! Tests of the mock over real sockets, with a raw HTTP/1.1 client that sees chunk boundaries,
//! chunk arrival times and whether the chunked body was terminated.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::*;

mod cancellation;
mod metrics_endpoint;
mod tokenizer;

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), MockError>>,
}

impl Server {
    async fn start(config: MockConfig) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, config, async {
            let _ = stopped.await;
        }));
        Server {
            addr,
            stop: Some(stop),
            task,
        }
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(5), &mut self.task)
            .await
            .expect("serve returns after shutdown")
            .expect("serve task")
            .expect("serve ok");
    }
}

fn fast() -> MockConfig {
    MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(1),
        tokens: Some(4),
        ..MockConfig::default()
    }
}

#[derive(Debug)]
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    /// Each body chunk (chunked encoding) with its arrival time since the request was written.
    chunks: Vec<(Duration, Vec<u8>)>,
    /// The chunked body ended with its terminating `0\r\n\r\n`.
    terminated: bool,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn body(&self) -> Vec<u8> {
        self.chunks.iter().flat_map(|(_, c)| c.clone()).collect()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body()).into_owned()
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`), read to EOF.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> RawResponse {
    let (stream, sent) = send(addr, method, path, headers, body).await;
    read_response(stream, sent).await
}

/// Write a request; returns the connection and when the write finished.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (TcpStream, Instant) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    stream.write_all(head.as_bytes()).await.expect("write");
    (stream, Instant::now())
}

/// Wait (bounded) until the response has started arriving, without consuming it.
async fn wait_for_response_start(stream: &TcpStream) {
    let mut probe = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(5), stream.peek(&mut probe))
        .await
        .expect("response starts within 5 s")
        .expect("peek");
}

type ResponseHead = (u16, Vec<(String, String)>, usize);

/// Read a whole response, decoding chunked bodies chunk by chunk with arrival times.
async fn read_response(mut stream: TcpStream, sent: Instant) -> RawResponse {
    let mut buf = Vec::new();
    let mut read = [0u8; 16 * 1024];
    // (status, headers, body start)
    let mut parsed_head: Option<ResponseHead> = None;
    let mut chunks = Vec::new();
    let mut terminated = false;
    let mut pos = 0;
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut read))
            .await
            .expect("response within 10 s")
            .unwrap_or(0);
        let at = sent.elapsed();
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&read[..n]);
        if parsed_head.is_none()
            && let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n")
        {
            let text = String::from_utf8_lossy(&buf[..end]).into_owned();
            let mut lines = text.split("\r\n");
            let status_line = lines.next().expect("status line");
            let status = status_line
                .split(' ')
                .nth(1)
                .expect("status code")
                .parse()
                .expect("numeric status");
            let headers = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .collect();
            parsed_head = Some((status, headers, end + 4));
            pos = end + 4;
        }
        let Some((_, headers, _)) = &parsed_head else {
            continue;
        };
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        if !chunked {
            continue;
        }
        // Decode every complete chunk now buffered, stamped with this read's time.
        while let Some(line_end) = buf[pos..].windows(2).position(|w| w == b"\r\n") {
            let size_text = String::from_utf8_lossy(&buf[pos..pos + line_end]).into_owned();
            let size = usize::from_str_radix(size_text.trim(), 16).expect("chunk size");
            let data_start = pos + line_end + 2;
            if buf.len() < data_start + size + 2 {
                break;
            }
            if size == 0 {
                terminated = true;
                pos = data_start + 2;
                break;
            }
            chunks.push((at, buf[data_start..data_start + size].to_vec()));
            pos = data_start + size + 2;
        }
    }
    let (status, headers, body_start) = parsed_head.expect("a response head");
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    if !chunked {
        chunks.push((sent.elapsed(), buf[body_start..].to_vec()));
        terminated = true;
    }
    RawResponse {
        status,
        headers,
        chunks,
        terminated,
    }
}

fn temp_path(name: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "llm-replay-mock-test-{}-{}-{name}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ))
}

const CHAT: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn routes_every_family_with_its_content_type_and_terminal_marker() {
    let server = Server::start(fast()).await;
    let cases: &[(&str, &str, &str, &[u8])] = &[
        (
            "/v1/chat/completions",
            CHAT,
            "text/event-stream",
            b"data: [DONE]\n\n",
        ),
        (
            "/v1/completions",
            r#"{"model":"m","stream":true,"prompt":"hi"}"#,
            "text/event-stream",
            b"data: [DONE]\n\n",
        ),
        (
            "/v1/responses",
            r#"{"model":"m","stream":true,"input":"hi"}"#,
            "text/event-stream",
            b"event: response.completed\n",
        ),
        (
            "/v1/messages",
            r#"{"model":"m","stream":true,"max_tokens":9,"messages":[]}"#,
            "text/event-stream",
            b"event: message_stop\n",
        ),
        (
            "/api/chat",
            r#"{"model":"m","messages":[]}"#,
            "application/x-ndjson",
            b"\"done\":true",
        ),
        (
            "/api/generate",
            r#"{"model":"m","prompt":"hi"}"#,
            "application/x-ndjson",
            b"\"done\":true",
        ),
        (
            "/model/anthropic.claude-v2%3A1/converse-stream",
            r#"{"messages":[]}"#,
            "application/vnd.amazon.eventstream",
            b"metadata",
        ),
        (
            "/model/anthropic.claude-v2%3A1/invoke-with-response-stream",
            r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":9,"messages":[]}"#,
            "application/vnd.amazon.eventstream",
            b"chunk",
        ),
    ];
    for (path, body, content_type, marker) in cases {
        let response = request(
            server.addr,
            "POST",
            path,
            &[("authorization", "Bearer x")],
            body,
        )
        .await;
        assert_eq!(response.status, 200, "{path}");
        assert!(
            response
                .header("content-type")
                .is_some_and(|v| v.starts_with(content_type)),
            "{path}: {:?}",
            response.header("content-type")
        );
        assert!(response.terminated, "{path}: chunked body terminated");
        let bytes = response.body();
        assert!(
            bytes.windows(marker.len()).any(|w| w == *marker),
            "{path}: no terminal marker in {}",
            response.text()
        );
        // Preamble (when the family has one) + 4 token frames + trailer, one chunk each.
        assert!(
            (5..=6).contains(&response.chunks.len()),
            "{path}: {} chunks",
            response.chunks.len()
        );
    }
    let response = request(server.addr, "GET", "/v1/models", &[], "").await;
    assert_eq!(response.status, 200);
    assert!(response.text().contains("mock-model"));
    let response = request(server.addr, "POST", "/v2/nothing", &[], "{}").await;
    assert_eq!(response.status, 404);
    let response = request(server.addr, "POST", "/v1/messages", &[], "{not json").await;
    assert_eq!(response.status, 400);
    let error: serde_json::Value = serde_json::from_slice(&response.body()).expect("json error");
    assert_eq!(error["type"], "error", "anthropic-shaped 400: {error}");
    server.shutdown().await;
}

#[tokio::test]
async fn non_streamed_requests_get_one_json_body() {
    let server = Server::start(fast()).await;
    let response = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    )
    .await;
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("content-length"),
        Some(response.body().len().to_string().as_str())
    );
    let body: serde_json::Value = serde_json::from_slice(&response.body()).expect("json");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "lorem ipsum dolor sit"
    );
    assert_eq!(body["usage"]["completion_tokens"], 4);
    let response = request(
        server.addr,
        "POST",
        "/api/generate",
        &[],
        r#"{"model":"m","prompt":"hi","stream":false}"#,
    )
    .await;
    let body: serde_json::Value = serde_json::from_slice(&response.body()).expect("json");
    assert_eq!(body["done"], true);
    assert_eq!(body["eval_count"], 4);
    server.shutdown().await;
}

#[tokio::test]
async fn request_max_tokens_sets_the_length_when_no_tokens_flag() {
    let server = Server::start(MockConfig {
        tokens: None,
        ..fast()
    })
    .await;
    let response = request(
        server.addr,
        "POST",
        "/v1/messages",
        &[],
        r#"{"model":"m","stream":true,"max_tokens":3,"messages":[]}"#,
    )
    .await;
    let text = response.text();
    assert_eq!(text.matches("event: content_block_delta").count(), 3);
    assert!(text.contains(r#""stop_reason":"max_tokens""#), "{text}");
    server.shutdown().await;
}

#[tokio::test]
async fn drop_fault_ends_the_chunked_body_without_its_terminator() {
    let server = Server::start(MockConfig {
        faults: FaultConfig {
            drop_rate: 1.0,
            ..fast().faults
        },
        ..fast()
    })
    .await;
    let response = request(server.addr, "POST", "/v1/chat/completions", &[], CHAT).await;
    assert_eq!(response.status, 200);
    assert!(!response.terminated, "no terminating chunk after a drop");
    let text = response.text();
    // Role chunk + half of the 4 tokens, then the cut.
    assert_eq!(response.chunks.len(), 3, "{text}");
    assert!(!text.contains("[DONE]"));
    server.shutdown().await;
}

#[tokio::test]
async fn error_frame_fault_sends_the_family_error_after_half_the_tokens() {
    let server = Server::start(MockConfig {
        faults: FaultConfig {
            error_frame_rate: 1.0,
            ..fast().faults
        },
        ..fast()
    })
    .await;
    let response = request(server.addr, "POST", "/v1/chat/completions", &[], CHAT).await;
    assert!(response.terminated);
    let text = response.text();
    assert_eq!(text.matches("\"delta\":{\"content\"").count(), 2, "{text}");
    assert!(
        text.ends_with("data: {\"error\":{\"message\":\"The server had an error while processing your request (injected by llm-replay mock).\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\ndata: [DONE]\n\n"),
        "{text}"
    );
    let response = request(
        server.addr,
        "POST",
        "/api/chat",
        &[],
        r#"{"model":"m","messages":[]}"#,
    )
    .await;
    let text = response.text();
    let last = text.lines().last().expect("lines");
    assert!(last.starts_with("{\"error\":"), "{text}");
    assert!(!text.contains("\"done\":true"));
    server.shutdown().await;
}

#[tokio::test]
async fn fail_rate_answers_500_in_the_family_shape_and_seed_is_deterministic() {
    let server = Server::start(MockConfig {
        faults: FaultConfig {
            fail_rate: 1.0,
            ..fast().faults
        },
        ..fast()
    })
    .await;
    let response = request(
        server.addr,
        "POST",
        "/model/m/converse-stream",
        &[],
        r#"{"messages":[]}"#,
    )
    .await;
    assert_eq!(response.status, 500);
    assert_eq!(
        response.header("x-amzn-errortype"),
        Some("InternalServerException:")
    );
    server.shutdown().await;

    // Half the requests fail; the same seed fails the same requests.
    let mut runs = Vec::new();
    for _ in 0..2 {
        let server = Server::start(MockConfig {
            seed: Some(7),
            faults: FaultConfig {
                fail_rate: 0.5,
                ..fast().faults
            },
            ..fast()
        })
        .await;
        let mut statuses = Vec::new();
        for _ in 0..16 {
            statuses.push(
                request(server.addr, "POST", "/v1/chat/completions", &[], CHAT)
                    .await
                    .status,
            );
        }
        server.shutdown().await;
        runs.push(statuses);
    }
    assert_eq!(runs[0], runs[1]);
    assert!(
        runs[0].contains(&500) && runs[0].contains(&200),
        "{:?}",
        runs[0]
    );
}

#[tokio::test]
async fn full_queue_answers_429_and_queued_requests_wait_their_turn() {
    let config = MockConfig {
        ttft: Duration::from_millis(20),
        itl: Duration::from_millis(10),
        tokens: Some(5),
        max_streams: Some(1),
        max_queue: Some(1),
        ..MockConfig::default()
    };
    let server = Server::start(config).await;
    let addr = server.addr;
    let (first_stream, first_sent) = send(addr, "POST", "/v1/chat/completions", &[], CHAT).await;
    // The response head is written on admission: once it arrives the only slot is taken.
    wait_for_response_start(&first_stream).await;
    let first = tokio::spawn(read_response(first_stream, first_sent));
    let second =
        tokio::spawn(async move { request(addr, "POST", "/v1/chat/completions", &[], CHAT).await });
    let first = first.await.expect("first");
    let second = second.await.expect("second");
    assert_eq!(first.status, 200);
    assert_eq!(second.status, 200);
    // The queued request starts after the first one ends: its first token comes at least one
    // whole stream (20 + 4 * 10 ms) after it was sent.
    let first_token = second.chunks[1].0;
    assert!(first_token >= Duration::from_millis(60), "{first_token:?}");
    server.shutdown().await;

    let server = Server::start(MockConfig {
        max_streams: Some(1),
        max_queue: Some(0),
        ttft: Duration::from_millis(300),
        ..fast()
    })
    .await;
    let addr = server.addr;
    let (first_stream, first_sent) = send(addr, "POST", "/v1/chat/completions", &[], CHAT).await;
    wait_for_response_start(&first_stream).await;
    let first = tokio::spawn(read_response(first_stream, first_sent));
    let rejected = request(addr, "POST", "/v1/chat/completions", &[], CHAT).await;
    assert_eq!(
        rejected.status, 429,
        "the only slot is busy and the queue holds 0"
    );
    let error: serde_json::Value = serde_json::from_slice(&rejected.body()).expect("json");
    assert_eq!(error["error"]["type"], "rate_limit_error");
    assert_eq!(first.await.expect("first").status, 200);
    server.shutdown().await;
}

#[tokio::test]
async fn write_log_has_each_request_head_and_frame_write_instants_with_its_tag() {
    let log = temp_path("truth.jsonl");
    let server = Server::start(MockConfig {
        write_log: Some(log.clone()),
        ..fast()
    })
    .await;
    let before = truth::unix_ns();
    let streamed = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &[(EXCHANGE_HEADER, "7")],
        CHAT,
    )
    .await;
    assert_eq!(streamed.status, 200);
    request(server.addr, "GET", "/api/version", &[], "").await;
    // Nothing is written before the server stops: the hot path only buffers.
    assert_eq!(std::fs::read_to_string(&log).expect("created at start"), "");
    server.shutdown().await;
    let text = std::fs::read_to_string(&log).expect("log written");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    let stream = &lines[0];
    assert_eq!(stream["exchange"], "7");
    assert_eq!(stream["status"], 200);
    assert_eq!(stream["version"], "HTTP/1.1");
    let ns = |key: &str| {
        stream[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in {stream}"))
    };
    // `fast()`: 4 tokens, so a role frame, 4 token frames, usage and the terminal marker.
    assert!(stream["frames"].as_u64().expect("frames") >= 5, "{stream}");
    assert!(ns("head_ns") >= before);
    // The role frame goes at once, the first token 5 ms after the head; each is written
    // after it was handed over.
    assert!(ns("first_handed_ns") >= ns("head_ns"), "{stream}");
    assert!(ns("first_write_ns") >= ns("first_handed_ns"), "{stream}");
    assert!(
        ns("first_token_handed_ns") >= ns("head_ns") + 5_000_000,
        "{stream}"
    );
    assert!(
        ns("first_token_write_ns") >= ns("first_token_handed_ns"),
        "{stream}"
    );
    assert!(ns("last_write_ns") >= ns("last_handed_ns"), "{stream}");
    // Deadlines are absolute from the head: the last token is due at 5 + 3 × 1 ms.
    assert!(
        ns("last_handed_ns") >= ns("head_ns") + 8_000_000,
        "{stream}"
    );
    // When they were due: planned from the head (5 ms, then 5 + 3 × 1 ms; the body's start
    // is read just after the head's stamp, the clocks' conversion is within a microsecond),
    // and never after they were handed over.
    assert!(
        ns("first_token_due_ns") + 50_000 >= ns("head_ns") + 5_000_000
            && ns("first_token_due_ns") <= ns("first_token_handed_ns"),
        "{stream}"
    );
    assert!(
        ns("last_due_ns") + 50_000 >= ns("head_ns") + 8_000_000
            && ns("last_due_ns") <= ns("last_handed_ns"),
        "{stream}"
    );
    assert_eq!(lines[1]["exchange"], serde_json::Value::Null);
    assert_eq!(lines[1]["frames"], 1);
    assert!(
        lines[1]["first_write_ns"].as_u64().is_some(),
        "{}",
        lines[1]
    );
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn request_log_has_one_line_per_request_on_arrival() {
    let log = temp_path("requests.jsonl");
    let server = Server::start(MockConfig {
        request_log: Some(log.clone()),
        ..fast()
    })
    .await;
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &[("x-llm-replay-exchange", "3")],
        CHAT,
    )
    .await;
    request(server.addr, "GET", "/api/version", &[], "").await;
    server.shutdown().await;
    let text = std::fs::read_to_string(&log).expect("log written");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0]["method"], "POST");
    assert_eq!(lines[0]["path"], "/v1/chat/completions");
    assert_eq!(lines[0]["exchange"], "3");
    assert!(lines[0]["unix_ms"].as_u64().expect("unix_ms") >= before);
    assert_eq!(lines[1]["method"], "GET");
    assert_eq!(lines[1]["exchange"], serde_json::Value::Null);
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn recorded_mode_serves_recorded_bytes_at_recorded_offsets() {
    // Frame offsets are asserted to ±5 ms.
    let _timing = common::test_timing::timing_lock().await;
    let path = temp_path("recording.jsonl");
    let lines = [
        serde_json::json!({
            "request": {"method": "POST", "path": "/v1/chat/completions", "body": "{\"a\":1}"},
            "response": {
                "status": 201,
                "headers": {"content-type": "text/event-stream", "x-recorded": "yes", "content-length": "999", "transfer-encoding": "chunked"},
                "frames": [
                    {"t_ms": 60.0, "data": "data: one\n\n"},
                    {"t_ms": 120.0, "data_b64": "AAEC"},
                    {"t_ms": 180.0, "data": "data: [DONE]\n\n"}
                ],
                "complete": true
            }
        }),
        serde_json::json!({
            "request": {"method": "POST", "path": "/v1/chat/completions", "body": "{\"no\":\"response\"}"}
        }),
        serde_json::json!({
            "request": {"method": "POST", "path": "/api/generate", "body": "{}"},
            "response": {"status": 200, "headers": {"content-type": "application/x-ndjson"},
                         "frames": [{"data": "{\"x\":1}\n"}, {"data": "{\"x\":2}\n"}]}
        }),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).expect("write recording");
    let recorded = Recorded::load(&path).expect("load");
    assert_eq!(recorded.len(), 3);
    let server = Server::start(MockConfig {
        recording: Some(Arc::new(recorded)),
        ttft: Duration::from_millis(30),
        itl: Duration::from_millis(20),
        tokens: Some(2),
        ..MockConfig::default()
    })
    .await;

    // By header.
    let response = request(
        server.addr,
        "POST",
        "/anything",
        &[("x-llm-replay-exchange", "0")],
        "ignored",
    )
    .await;
    assert_eq!(response.status, 201);
    assert_eq!(response.header("x-recorded"), Some("yes"));
    assert_eq!(response.header("content-length"), None);
    assert!(response.terminated);
    let bodies: Vec<&[u8]> = response.chunks.iter().map(|(_, c)| c.as_slice()).collect();
    assert_eq!(
        bodies,
        [
            &b"data: one\n\n"[..],
            &[0u8, 1, 2][..],
            &b"data: [DONE]\n\n"[..]
        ]
    );
    for ((at, _), expected_ms) in response.chunks.iter().zip([60.0, 120.0, 180.0]) {
        let ms = at.as_secs_f64() * 1000.0;
        assert!(
            (ms - expected_ms).abs() <= 5.0,
            "frame at {ms:.2} ms, recorded {expected_ms} ms"
        );
    }

    // By (method, path, body).
    let response = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        "{\"a\":1}",
    )
    .await;
    assert_eq!(response.status, 201);

    // Frames without t_ms are paced by ttft/itl.
    let response = request(server.addr, "POST", "/api/generate", &[], "{}").await;
    assert_eq!(response.text(), "{\"x\":1}\n{\"x\":2}\n");
    let ms: Vec<f64> = response
        .chunks
        .iter()
        .map(|(t, _)| t.as_secs_f64() * 1000.0)
        .collect();
    assert!(
        (ms[0] - 30.0).abs() <= 5.0 && (ms[1] - 50.0).abs() <= 5.0,
        "{ms:?}"
    );

    // An exchange without a response, and an unmatched request: synthetic.
    for headers in [&[("x-llm-replay-exchange", "1")][..], &[][..]] {
        let response = request(server.addr, "POST", "/v1/chat/completions", headers, CHAT).await;
        assert_eq!(response.status, 200);
        assert!(response.text().contains("\"content\":\"lorem\""));
    }

    // A bad index is the client's mistake.
    let response = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &[("x-llm-replay-exchange", "3")],
        CHAT,
    )
    .await;
    assert_eq!(response.status, 400);
    assert!(response.text().contains("0..3"), "{}", response.text());
    server.shutdown().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn serve_returns_promptly_with_a_stream_still_open() {
    let server = Server::start(MockConfig {
        ttft: Duration::from_secs(60),
        ..fast()
    })
    .await;
    let addr = server.addr;
    let (stream, sent) = send(addr, "POST", "/v1/chat/completions", &[], CHAT).await;
    wait_for_response_start(&stream).await;
    let client = tokio::spawn(read_response(stream, sent));
    let started = Instant::now();
    server.shutdown().await;
    assert!(started.elapsed() < SHUTDOWN_GRACE + Duration::from_secs(1));
    let response = client.await.expect("client");
    assert!(!response.terminated, "the open stream was cut at shutdown");
}

#[tokio::test]
async fn usage_requested_follows_include_usage_for_openai_only() {
    let server = Server::start(MockConfig {
        usage: UsageMode::Requested,
        ..fast()
    })
    .await;
    let without = request(server.addr, "POST", "/v1/chat/completions", &[], CHAT).await;
    assert!(!without.text().contains("usage"), "{}", without.text());
    let with = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#,
    )
    .await;
    assert!(
        with.text().contains(r#""completion_tokens":4"#),
        "{}",
        with.text()
    );
    let anthropic = request(
        server.addr,
        "POST",
        "/v1/messages",
        &[],
        r#"{"model":"m","stream":true,"max_tokens":9,"messages":[]}"#,
    )
    .await;
    assert!(anthropic.text().contains(r#""usage":{"output_tokens":4}"#));
    server.shutdown().await;
}

#[tokio::test]
async fn prefill_per_token_delays_the_first_token_by_the_input_size() {
    let server = Server::start(MockConfig {
        prefill_per_token: Duration::from_millis(20),
        ..fast()
    })
    .await;
    // 40 characters of prompt = 10 input tokens = 200 ms of prefill on top of the 5 ms TTFT.
    let body = format!(
        r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(40)
    );
    let response = request(server.addr, "POST", "/v1/chat/completions", &[], &body).await;
    let first_token = response
        .chunks
        .iter()
        .find(|(_, c)| c.windows(11).any(|w| w == b"{\"content\":"))
        .expect("a token frame")
        .0;
    assert!(first_token >= Duration::from_millis(205), "{first_token:?}");
    assert!(response.text().contains(r#""prompt_tokens":10"#));
    server.shutdown().await;
}

#[tokio::test]
async fn recorded_mode_drop_fault_cuts_after_half_the_frames() {
    let path = temp_path("recording-drop.jsonl");
    let line = serde_json::json!({
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": "{}"},
        "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
                     "frames": [{"t_ms": 1.0, "data": "data: 1\n\n"}, {"t_ms": 2.0, "data": "data: 2\n\n"},
                                {"t_ms": 3.0, "data": "data: 3\n\n"}, {"t_ms": 4.0, "data": "data: [DONE]\n\n"}]}
    });
    std::fs::write(&path, format!("{line}\n")).expect("write recording");
    let server = Server::start(MockConfig {
        recording: Some(Arc::new(Recorded::load(&path).expect("load"))),
        faults: FaultConfig {
            drop_rate: 1.0,
            ..fast().faults
        },
        ..fast()
    })
    .await;
    let response = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &[(EXCHANGE_HEADER, "0")],
        "{}",
    )
    .await;
    assert_eq!(response.text(), "data: 1\n\ndata: 2\n\n");
    assert!(!response.terminated);
    server.shutdown().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn drop_fault_writes_the_kept_frames_even_when_the_cut_is_due_with_them() {
    // Every frame and the cut share offset 0: they fall due in one write pass, as they do
    // when the server task runs late. The kept frames still reach the client before the cut.
    let path = temp_path("recording-drop-at-once.jsonl");
    let line = serde_json::json!({
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": "{}"},
        "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
                     "frames": [{"t_ms": 0.0, "data": "data: 1\n\n"}, {"t_ms": 0.0, "data": "data: 2\n\n"},
                                {"t_ms": 0.0, "data": "data: 3\n\n"}, {"t_ms": 0.0, "data": "data: [DONE]\n\n"}]}
    });
    std::fs::write(&path, format!("{line}\n")).expect("write recording");
    let server = Server::start(MockConfig {
        recording: Some(Arc::new(Recorded::load(&path).expect("load"))),
        faults: FaultConfig {
            drop_rate: 1.0,
            ..fast().faults
        },
        ..fast()
    })
    .await;
    for _ in 0..5 {
        let response = request(
            server.addr,
            "POST",
            "/v1/chat/completions",
            &[(EXCHANGE_HEADER, "0")],
            "{}",
        )
        .await;
        assert_eq!(response.text(), "data: 1\n\ndata: 2\n\n");
        assert!(!response.terminated);
    }
    server.shutdown().await;
    let _ = std::fs::remove_file(&path);
}

/// `--fail-after N`: the first N requests are served, every one after answers
/// `--fail-status` with `--fail-body` after `--fail-delay` (a server that dies mid-run).
#[tokio::test]
async fn fail_after_serves_n_requests_then_fails_each_with_the_given_status_body_and_delay() {
    let body = r#"{"error":{"message":"upstream connect error","type":"None","code":"503"}}"#;
    let server = Server::start(MockConfig {
        failure: FailureConfig {
            after: Some(2),
            status: 503,
            delay: Duration::from_millis(50),
            body: Some(Bytes::from_static(body.as_bytes())),
        },
        ..fast()
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let started = Instant::now();
        let response = request(server.addr, "POST", "/v1/chat/completions", &[], CHAT).await;
        if response.status == 503 {
            assert_eq!(response.text(), body);
            assert_eq!(response.header("content-type"), Some("application/json"));
            assert!(started.elapsed() >= Duration::from_millis(50));
        }
        statuses.push(response.status);
    }
    assert_eq!(statuses, [200, 200, 503, 503]);
    server.shutdown().await;

    // Without a body: the family's error object, with the status asked for.
    let server = Server::start(MockConfig {
        failure: FailureConfig {
            after: Some(0),
            status: 404,
            ..FailureConfig::default()
        },
        ..fast()
    })
    .await;
    let response = request(
        server.addr,
        "POST",
        "/v1/messages",
        &[],
        r#"{"model":"m","max_tokens":4,"messages":[]}"#,
    )
    .await;
    assert_eq!(response.status, 404);
    assert!(
        response.text().contains(r#""type":"error""#),
        "{}",
        response.text()
    );
    server.shutdown().await;
}

#[test]
fn failure_flags_parse_into_the_config() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        mock: MockArgs,
    }
    use clap::Parser as _;
    let cli = Cli::try_parse_from([
        "mock",
        "--fail-after",
        "20",
        "--fail-status",
        "502",
        "--fail-delay",
        "1s",
        "--fail-body",
        "Bad Gateway",
    ])
    .expect("parses");
    let config = cli.mock.into_config().expect("valid");
    assert_eq!(
        config.failure,
        FailureConfig {
            after: Some(20),
            status: 502,
            delay: Duration::from_secs(1),
            body: Some(Bytes::from_static(b"Bad Gateway")),
        }
    );
    assert_eq!(
        Cli::try_parse_from(["mock"])
            .expect("defaults")
            .mock
            .into_config()
            .expect("valid")
            .failure,
        FailureConfig::default()
    );
    // A success status is no failure; a body and a body file are one too many.
    assert!(Cli::try_parse_from(["mock", "--fail-status", "200"]).is_err());
    assert!(
        Cli::try_parse_from(["mock", "--fail-body", "x", "--fail-body-file", "/dev/null"]).is_err()
    );
}

/// `MockConfig::default()` (what the embedded mock of `run` starts from) is exactly what
/// `llm-replay mock` with no flag runs.
#[test]
fn the_typed_default_is_the_command_lines_default() {
    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        mock: MockArgs,
    }
    let parsed = <Command as clap::Parser>::try_parse_from(["mock"])
        .expect("no flag parses")
        .mock
        .into_config()
        .expect("the defaults are valid");
    assert_eq!(
        format!("{parsed:?}"),
        format!("{:?}", MockConfig::default())
    );
}
