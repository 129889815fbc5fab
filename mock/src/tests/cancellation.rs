//! A client that leaves mid-stream (a user pressing stop) is a cancel the server sees: the
//! request log gets a `cancelled` line and the truth log the instant; the mock's own cuts and
//! shutdown are not cancels.

use super::*;

fn unix_ns_now() -> u64 {
    truth::unix_ns()
}

fn json_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// The client reads the head and two frames (the role chunk and the first token), then
/// closes its socket; the next frame is 60 ms away, so only hyper's notice of the close (a
/// read of 0 while the body waits) can report it in time. Both logs must put the cancel
/// within 2 ms of the close, read on the same clock (CLOCK_REALTIME) by the client just
/// before it closes: the notice takes well under a millisecond on loopback.
#[tokio::test]
async fn a_client_closing_mid_stream_is_logged_as_a_cancel_at_once() {
    const TOLERANCE_NS: u64 = 2_000_000;
    let _timing = common::test_timing::timing_lock().await;
    let truth_log = temp_path("cancel-truth.jsonl");
    let request_log = temp_path("cancel-requests.jsonl");
    let server = Server::start(MockConfig {
        ttft: Duration::from_millis(5),
        itl: Duration::from_millis(60),
        tokens: Some(40),
        write_log: Some(truth_log.clone()),
        request_log: Some(request_log.clone()),
        ..MockConfig::default()
    })
    .await;
    let mut stream = TcpStream::connect(server.addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{EXCHANGE_HEADER}: 9\r\n\r\n{CHAT}",
        CHAT.len()
    );
    let sent_ns = unix_ns_now();
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut received = Vec::new();
    let mut read = [0u8; 4096];
    while received.windows(6).filter(|w| w == b"data: ").count() < 2 {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut read))
            .await
            .expect("frames within 5 s")
            .expect("read");
        assert!(n > 0, "the stream ended early");
        received.extend_from_slice(&read[..n]);
    }
    assert!(received.starts_with(b"HTTP/1.1 200"));
    let closed_ns = unix_ns_now();
    drop(stream);

    // The request log is written as things happen: wait (bounded) for the cancel line.
    let deadline = Instant::now() + Duration::from_secs(5);
    let cancel = loop {
        let lines = json_lines(&request_log);
        if let Some(line) = lines.iter().find(|l| l["event"] == "cancelled") {
            break line.clone();
        }
        assert!(Instant::now() < deadline, "no cancel logged: {lines:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    server.shutdown().await;

    let lines = json_lines(&request_log);
    assert_eq!(lines.len(), 2, "{lines:?}");
    // The request's own line is as it always was: no `event` key.
    assert_eq!(lines[0]["method"], "POST");
    assert!(lines[0].get("event").is_none(), "{}", lines[0]);
    assert_eq!(cancel["exchange"], "9");
    assert_eq!(cancel["path"], "/v1/chat/completions");
    assert_eq!(cancel["frames_sent"], 2, "{cancel}");
    let unix_ms = cancel["unix_ms"].as_u64().expect("unix_ms");
    assert!(
        unix_ms >= closed_ns / 1_000_000 && unix_ms * 1_000_000 <= closed_ns + TOLERANCE_NS,
        "cancel logged at {unix_ms} ms, the client closed at {closed_ns} ns"
    );
    // From the head's arrival (after the client's send) to the notice (after its close).
    let after_ms = cancel["after_ms"].as_f64().expect("after_ms");
    let client_ms = (closed_ns - sent_ns) as f64 / 1e6;
    assert!(
        (after_ms - client_ms).abs() <= TOLERANCE_NS as f64 / 1e6,
        "after_ms {after_ms}, the client's send to close {client_ms} ms"
    );

    let truth = json_lines(&truth_log);
    assert_eq!(truth.len(), 1, "{truth:?}");
    let record = &truth[0];
    assert_eq!(record["frames"], 2, "{record}");
    let cancelled_ns = record["cancelled_ns"].as_u64().expect("cancelled_ns");
    assert!(
        cancelled_ns >= closed_ns && cancelled_ns <= closed_ns + TOLERANCE_NS,
        "cancelled {} µs after the close",
        (cancelled_ns as f64 - closed_ns as f64) / 1e3
    );
    // What the whole answer's usage says: 40 tokens; "hi" is one input token estimated.
    assert_eq!(record["output_tokens"], 40, "{record}");
    assert_eq!(record["input_tokens"], 1, "{record}");
    let _ = std::fs::remove_file(&truth_log);
    let _ = std::fs::remove_file(&request_log);
}

/// An answer read whole, the mock's own injected cut, and a stream still open at shutdown:
/// none of them is a cancel.
#[tokio::test]
async fn whole_answers_injected_cuts_and_shutdown_are_not_cancels() {
    let cut_truth = temp_path("nocancel-cut-truth.jsonl");
    let shutdown_truth = temp_path("nocancel-shutdown-truth.jsonl");
    let request_log = temp_path("nocancel-requests.jsonl");
    let server = Server::start(MockConfig {
        write_log: Some(cut_truth.clone()),
        request_log: Some(request_log.clone()),
        faults: FaultConfig {
            drop_rate: 1.0,
            ..fast().faults
        },
        ..fast()
    })
    .await;
    let cut = request(server.addr, "POST", "/v1/chat/completions", &[], CHAT).await;
    assert!(!cut.terminated, "the injected drop cut it");
    let whole = request(server.addr, "GET", "/v1/models", &[], "").await;
    assert_eq!(whole.status, 200);
    server.shutdown().await;

    let server = Server::start(MockConfig {
        ttft: Duration::from_secs(60),
        write_log: Some(shutdown_truth.clone()),
        request_log: Some(request_log.clone()),
        ..fast()
    })
    .await;
    let (stream, sent) = send(server.addr, "POST", "/v1/chat/completions", &[], CHAT).await;
    wait_for_response_start(&stream).await;
    let client = tokio::spawn(read_response(stream, sent));
    server.shutdown().await;
    assert!(!client.await.expect("client").terminated);

    let lines = json_lines(&request_log);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines.iter().all(|l| l.get("event").is_none()), "{lines:?}");
    let cut = json_lines(&cut_truth);
    assert_eq!(cut.len(), 2, "{cut:?}");
    let open = json_lines(&shutdown_truth);
    assert_eq!(open.len(), 1, "{open:?}");
    for record in cut.iter().chain(&open) {
        assert_eq!(record["cancelled_ns"], serde_json::Value::Null, "{record}");
    }
    // The cut stream carried half its 4 tokens; `/v1/models` is no model answer.
    assert_eq!(cut[0]["output_tokens"], 2, "{}", cut[0]);
    assert_eq!(
        cut[1]["output_tokens"],
        serde_json::Value::Null,
        "{}",
        cut[1]
    );
    assert_eq!(open[0]["output_tokens"], 4, "{}", open[0]);
    for path in [&cut_truth, &shutdown_truth, &request_log] {
        let _ = std::fs::remove_file(path);
    }
}
