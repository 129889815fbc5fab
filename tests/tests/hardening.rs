//! Hostile input and hostile peers (issue 7): every number validated at the edge, secrets that
//! never leak into recordings, replays, reports or error messages, outputs that never destroy
//! their input, and waits that are bounded. Each test reproduces a failure of the earlier code
//! with the release binaries, real sockets and real processes.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fixtures::{
    MockServer, Spawned, TempDir, bin, eventually, llm_replay, num, request_log,
    write_chat_recording,
};
use serde_json::json;

use crate::raw_server::{Gateway, start_gateway};

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn small_recording(dir: &TempDir) -> String {
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 4, 5, Some(10.0));
    path_str(&recording).to_owned()
}

fn replay_with(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(bin("llm-replay"));
    command.args(args).stdin(Stdio::null());
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("llm-replay runs")
}

fn all_output(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Item 1: an empty, blank or short token does not open the coordinator to other hosts.
#[test]
fn empty_blank_or_short_tokens_are_refused_off_loopback() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("token");
    let recording = small_recording(&dir);
    let base = [
        "run",
        recording.as_str(),
        "--listen",
        "0.0.0.0:0",
        "--expect-workers",
        "1",
        "--join-timeout",
        "1s",
    ];
    for (token, env) in [
        (Some(""), None),
        (Some("   "), None),
        (Some("short-token"), None),
        (None, Some("")),
    ] {
        let mut args = base.to_vec();
        if let Some(token) = token {
            args.extend(["--token", token]);
        }
        let env: Vec<(&str, &str)> = env.map(|v| ("LLM_REPLAY_TOKEN", v)).into_iter().collect();
        let out = replay_with(&args, &env);
        let text = all_output(&out);
        assert_eq!(
            out.status.code(),
            Some(2),
            "token {token:?} env {env:?}: {text}"
        );
        assert!(
            text.contains("--token") || text.contains("token is"),
            "{text}"
        );
    }
}

/// Item 2: TLS options with an `http://` coordinator are a usage error, not a plaintext link.
#[test]
fn worker_tls_options_with_an_http_coordinator_are_refused() {
    let _parallel = fixtures::parallel_lock();
    let out = Command::new(bin("llm-replay-worker"))
        .args([
            "--coordinator",
            "http://127.0.0.1:9",
            "--tls-ca",
            "/nonexistent-ca.pem",
            "--once",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("worker runs");
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));
    assert!(all_output(&out).contains("TLS"));
}

/// Item 6: a malformed `--header` does not echo its value.
#[test]
fn a_malformed_header_does_not_echo_its_value() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("header");
    let recording = small_recording(&dir);
    for header in [
        "Authorization Bearer sk-SECRET-1234",
        "Bad Name: sk-SECRET-1234",
    ] {
        let out = replay_with(&["run", &recording, "--header", header], &[]);
        let text = all_output(&out);
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(!text.contains("sk-SECRET"), "the secret leaked: {text}");
    }
}

/// Items 4 and 5: credentials outside the old built-in list (headers and query parameters)
/// are neither replayed nor shown; a target's userinfo and credential query are redacted in
/// every output, and a target with a query gets the path before the query.
#[test]
fn credentials_are_neither_replayed_nor_shown() {
    let _parallel = fixtures::parallel_lock();
    let server = start_gateway(Gateway {
        content_type: Some("text/event-stream"),
        hold_after_done: Duration::ZERO,
        big_body: None,
    });
    let dir = TempDir::new("credentials");
    let recording = dir.join("rec.jsonl");
    let line = json!({
        "request": {"method": "POST",
            "path": "/v1/chat/completions?alt=sse&key=SECRET-QUERY-KEY",
            "headers": {
                "content-type": "application/json",
                "x-goog-api-key": "SECRET-GOOG",
                "ocp-apim-subscription-key": "SECRET-APIM",
                "x-auth-token": "SECRET-AUTH",
                "x-vendor-api-key": "SECRET-VENDOR",
                "anthropic-version": "2023-06-01"},
            "body": "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"}
    });
    std::fs::write(&recording, format!("{line}\n")).expect("write");
    let target = format!(
        "{}/?api-version=7&api-key=SECRET-TARGET",
        server
            .url
            .replacen("http://", "http://user:SECRET-PASSWORD@", 1)
    );
    let report = dir.join("report.json");
    let markdown = dir.join("report.md");
    let out = replay_with(
        &[
            "run",
            path_str(&recording),
            "--target",
            &target,
            "--report-json",
            path_str(&report),
            "--report-md",
            path_str(&markdown),
        ],
        &[],
    );
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let heads = server.heads.lock().expect("heads").clone();
    // The model request, and the coordinator's probe of the target's /metrics (which this
    // server answers with its stream, not Prometheus text: a note, no more scrapes).
    let (scrapes, requests): (Vec<&String>, Vec<&String>) =
        heads.iter().partition(|h| h.starts_with("GET /metrics "));
    assert_eq!((requests.len(), scrapes.len()), (1, 1), "{heads:?}");
    for scrape in &scrapes {
        for secret in [
            "SECRET-GOOG",
            "SECRET-APIM",
            "SECRET-AUTH",
            "SECRET-VENDOR",
            "SECRET-QUERY-KEY",
            "SECRET-TARGET",
        ] {
            assert!(
                !scrape.contains(secret),
                "{secret} went to /metrics: {scrape}"
            );
        }
    }
    let head = requests[0];
    println!("{head}");
    assert!(
        head.starts_with(
            "POST /v1/chat/completions?alt=sse&api-version=7&api-key=SECRET-TARGET HTTP/1.1"
        ),
        "the path goes before the target's query, the recorded key is dropped: {head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("anthropic-version: 2023-06-01")
    );
    for secret in [
        "SECRET-GOOG",
        "SECRET-APIM",
        "SECRET-AUTH",
        "SECRET-VENDOR",
        "SECRET-QUERY-KEY",
    ] {
        assert!(!head.contains(secret), "{secret} was replayed: {head}");
    }
    let shown = format!(
        "{text}{}{}",
        std::fs::read_to_string(&report).expect("report"),
        std::fs::read_to_string(&markdown).expect("markdown")
    );
    for secret in ["SECRET-PASSWORD", "SECRET-TARGET"] {
        assert!(!shown.contains(secret), "{secret} was shown");
    }
    assert!(shown.contains("api-key=REDACTED"));
}

/// Item 4: the recording proxy does not store those credentials either.
#[test]
fn the_proxy_does_not_record_credentials_outside_the_old_list() {
    let _parallel = fixtures::parallel_lock();
    let mock = MockServer::start(&["--ttft", "1ms", "--itl", "1ms", "--tokens", "3"]);
    let dir = TempDir::new("proxy-credentials");
    let out_path = dir.join("recorded.jsonl");
    let mut recorder = Command::new(bin("llm-replay"))
        .args([
            "record",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &mock.url,
            "--out",
            path_str(&out_path),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("record starts");
    let mut line = String::new();
    BufReader::new(recorder.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("readiness line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("URL")
        .to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let response = reqwest::Client::new()
            .post(format!("{url}/v1/chat/completions?api-key=SECRET-Q"))
            .header("x-goog-api-key", "SECRET-H1")
            .header("ocp-apim-subscription-key", "SECRET-H2")
            .header("x-auth-token", "SECRET-H3")
            .header("content-type", "application/json")
            .body(r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
            .send()
            .await
            .expect("through the proxy");
        assert!(response.status().is_success());
        let _ = response.bytes().await;
    });
    // SIGTERM: the recorder drains and exits.
    let _ = Command::new("kill")
        .args(["-TERM", &recorder.id().to_string()])
        .status();
    let _ = recorder.wait();
    let recorded = std::fs::read_to_string(&out_path).expect("recording");
    assert!(recorded.contains("/v1/chat/completions"), "{recorded}");
    for secret in ["SECRET-Q", "SECRET-H1", "SECRET-H2", "SECRET-H3"] {
        assert!(
            !recorded.contains(secret),
            "{secret} was recorded: {recorded}"
        );
    }
}

/// Item 8: huge numbers are refused at the edge with the flag or `file:line: field`, never a
/// panic; item 22: zero durations are refused; item 23: every time flag takes a duration.
#[test]
fn numbers_are_validated_at_the_edge() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("numbers");
    let recording = small_recording(&dir);
    let huge = dir.join("huge.jsonl");
    std::fs::write(
        &huge,
        "{\"at_ms\":1e300,\"request\":{\"path\":\"/v1/chat/completions\",\"body\":\"{}\"}}\n",
    )
    .expect("write");
    let huge_t = dir.join("huge-t.jsonl");
    std::fs::write(
        &huge_t,
        "{\"request\":{\"path\":\"/v1/chat/completions\",\"body\":\"{}\"},\"response\":{\"status\":200,\"frames\":[{\"t_ms\":1e20,\"data\":\"data: [DONE]\\n\\n\"}]}}\n",
    )
    .expect("write");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["run", path_str(&huge)], "huge.jsonl:1: at_ms"),
        (
            vec!["run", path_str(&huge_t)],
            "huge-t.jsonl:1: response.frames[0].t_ms",
        ),
        (vec!["run", &recording, "--speed", "1e-300"], "--speed"),
        (vec!["run", &recording, "--rate", "1e-300"], "--rate"),
        (
            vec!["run", &recording, "--heartbeat-timeout", "inf"],
            "--heartbeat-timeout",
        ),
        (vec!["run", &recording, "--duration", "0s"], "--duration"),
        (vec!["run", &recording, "--timeout", "0s"], "--timeout"),
    ];
    for (args, expected) in cases {
        let out = replay_with(&args, &[]);
        let text = all_output(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert!(
            text.contains(expected),
            "{args:?}: expected {expected:?} in {text}"
        );
        assert!(!text.contains("panicked"), "{text}");
    }
    // Durations everywhere: `2s` and `500ms` are accepted.
    let mock = MockServer::start(&["--ttft", "1ms", "--itl", "1ms", "--tokens", "3"]);
    let out = replay_with(
        &[
            "run",
            &recording,
            "--target",
            &mock.url,
            "--heartbeat-timeout",
            "2s",
            "--timeout",
            "500ms",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
}

/// Item 18: a torn last line is a warning everywhere, including with the embedded mock.
#[test]
fn a_torn_last_line_is_a_warning_with_the_embedded_mock_too() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("torn");
    let recording = dir.join("torn.jsonl");
    let line = json!({
        "at_ms": 0.0,
        "request": {"method": "POST", "path": "/v1/chat/completions",
            "body": "{\"model\":\"m\",\"stream\":true,\"messages\":[]}"},
        "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
            "frames": [{"t_ms": 5.0, "data": "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"},
                       {"t_ms": 6.0, "data": "data: [DONE]\n\n"}], "complete": true}
    });
    std::fs::write(&recording, format!("{line}\n{{\"request\":{{\"pa")).expect("write");
    let report = dir.join("report.json");
    let out = llm_replay(&["run", path_str(&recording)], Some(&report));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        format!("{}{}", out.stdout, out.stderr).contains("torn last line"),
        "{}",
        out.stdout
    );
    let report = out.report.expect("report");
    assert_eq!(num(&report, &["requests", "succeeded"]), 1.0);
}

/// Item 16: an export or import whose output is its input is refused and the input is left
/// whole.
#[test]
fn an_output_that_is_the_input_is_refused() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("same-file");
    let recording = small_recording(&dir);
    let before = std::fs::read(&recording).expect("read");
    let out = replay_with(&["export", "aiperf", &recording, "-o", &recording], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));
    assert_eq!(std::fs::read(&recording).expect("read"), before);

    let batch = dir.join("batch.jsonl");
    std::fs::write(
        &batch,
        "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}\n",
    )
    .expect("write");
    let batch_before = std::fs::read(&batch).expect("read");
    let out = replay_with(
        &[
            "import",
            "openai-batch",
            path_str(&batch),
            "-o",
            path_str(&batch),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));
    assert_eq!(std::fs::read(&batch).expect("read"), batch_before);
    // An ordinary export still works and leaves no temporary file behind.
    let exported = dir.join("out.jsonl");
    let out = replay_with(
        &["export", "aiperf", &recording, "-o", path_str(&exported)],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".partial-")), "{names:?}");
}

/// Item 20: a worker that dials a peer which accepts the connection and never answers gives up
/// within its heartbeat timeout instead of hanging.
#[test]
fn a_worker_gives_up_on_a_silent_peer() {
    let _parallel = fixtures::parallel_lock();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let held = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().take(4) {
            held.push(stream);
        }
        std::thread::sleep(Duration::from_secs(30));
        drop(held);
    });
    let started = Instant::now();
    let mut worker = Spawned::start(
        &bin("llm-replay-worker"),
        &[
            "--coordinator",
            &addr,
            "--once",
            "--heartbeat-timeout",
            "1s",
            "--connect-patience",
            "2s",
        ],
        &[],
    );
    let code = worker.wait_timeout(Duration::from_secs(15));
    println!("worker gave up after {:?}", started.elapsed());
    assert!(
        matches!(code, Some(c) if c != 0),
        "the worker hung or succeeded: {code:?}: {}",
        worker.stderr()
    );
    drop(held);
}

/// Item 10: a huge error body and a huge one-body answer are not held whole by the worker.
#[test]
fn huge_bodies_are_capped_in_the_worker() {
    // Heavy in memory, timed by nothing.
    let _parallel = fixtures::parallel_lock();
    const BIG: usize = 256 << 20;
    for (status, expect_key) in [(500u16, "failed"), (200u16, "succeeded")] {
        let server = start_gateway(Gateway {
            content_type: None,
            hold_after_done: Duration::ZERO,
            big_body: Some((status, BIG)),
        });
        let dir = TempDir::new("big-body");
        let recording = dir.join("rec.jsonl");
        let line = json!({"request": {"method": "POST", "path": "/v1/chat/completions",
            "body": "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"}});
        std::fs::write(&recording, format!("{line}\n{line}\n")).expect("write");
        let report = dir.join("report.json");
        let out = llm_replay(
            &[
                "run",
                path_str(&recording),
                "--target",
                &server.url,
                "--concurrency",
                "1",
            ],
            Some(&report),
        );
        let report = out.report.expect("report");
        let rss = report["run"]["workers"][0]["peak_rss_mb"]
            .as_f64()
            .expect("the worker's peak RSS");
        println!(
            "status {status}: worker peak RSS {rss:.1} MB for two {} MB bodies",
            BIG >> 20
        );
        assert_eq!(
            num(&report, &["requests", expect_key]),
            2.0,
            "{}",
            out.stdout
        );
        assert!(rss < 120.0, "the worker held the body: peak RSS {rss} MB");
    }
}

/// Item 17: an output path that cannot be written is found before any load is sent; a file
/// that fails at the end does not stop the others from being written.
#[test]
fn output_paths_are_checked_before_the_load_and_each_is_written() {
    let _parallel = fixtures::parallel_lock();
    let mock = MockServer::start(&["--ttft", "1ms", "--itl", "1ms", "--tokens", "3"]);
    let dir = TempDir::new("outputs");
    let recording = small_recording(&dir);
    let log = dir.join("requests.log");
    let mock_logged = MockServer::start(&[
        "--ttft",
        "1ms",
        "--itl",
        "1ms",
        "--tokens",
        "3",
        "--request-log",
        path_str(&log),
    ]);
    let out = replay_with(
        &[
            "run",
            &recording,
            "--target",
            &mock_logged.url,
            "--report-json",
            path_str(&dir.join("ok.json")),
            "--report-html",
            "/nonexistent-dir/report.html",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));
    assert!(all_output(&out).contains("/nonexistent-dir/report.html"));
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.trim().is_empty(), "load was sent: {logged}");

    // /dev/full opens but cannot be written: the other files are written all the same.
    let md = dir.join("report.md");
    let junit = dir.join("goals.xml");
    let out = replay_with(
        &[
            "run",
            &recording,
            "--target",
            &mock.url,
            "--report-json",
            "/dev/full",
            "--report-md",
            path_str(&md),
            "--junit",
            path_str(&junit),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(3), "{}", all_output(&out));
    assert!(all_output(&out).contains("/dev/full"));
    assert!(
        md.exists() && junit.exists(),
        "the other outputs were not written"
    );
}

/// Item 13: SIGTERM during `run` stops the load, collects what the workers measured, writes
/// every requested output and exits 3.
#[test]
fn sigterm_during_a_run_writes_the_partial_report() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("sigterm");
    let arrivals = dir.join("arrivals.jsonl");
    let mock = MockServer::start(&[
        "--ttft",
        "20ms",
        "--itl",
        "10ms",
        "--tokens",
        "50",
        "--request-log",
        path_str(&arrivals),
    ]);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 200, 50, None);
    let report = dir.join("report.json");
    let md = dir.join("report.md");
    let mut run = Spawned::start(
        &bin("llm-replay"),
        &[
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--concurrency",
            "2",
            "--workers",
            "2",
            "--report-json",
            path_str(&report),
            "--report-md",
            path_str(&md),
        ],
        &[],
    );
    // The run is under way and has measured: each of its 2 slots (one a worker) sends its
    // next request when its last one (0.5 s) ended, so 8 arrivals mean 6 requests done.
    assert!(
        eventually(Duration::from_secs(30), || request_log(&arrivals).len()
            >= 8),
        "the run did not get going: {}",
        run.stderr()
    );
    let pid = run.child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let code = run.wait_timeout(Duration::from_secs(20));
    assert_eq!(code, Some(3), "{}\n{}", run.stdout(), run.stderr());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report written"))
            .expect("JSON");
    assert!(md.exists(), "the Markdown report was not written");
    let succeeded = num(&report, &["requests", "succeeded"]);
    let total = num(&report, &["requests", "total"]);
    println!("interrupted after 8 arrivals: {succeeded} succeeded of {total}");
    assert!(
        succeeded >= 4.0,
        "what the workers measured was lost: {report:#}"
    );
    assert!(succeeded < 200.0);
    let parts: f64 = ["succeeded", "failed", "ended_early", "lost", "not_started"]
        .iter()
        .map(|k| num(&report, &["requests", k]))
        .sum();
    assert_eq!(parts, total, "{report:#}");
    assert!(run.stdout().contains("interrupted"), "{}", run.stdout());
}

/// Item 14: a sweep level that fails keeps the levels already measured.
#[test]
fn a_failed_sweep_level_keeps_the_levels_before_it() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("sweep-fail");
    let arrivals = dir.join("arrivals.jsonl");
    let mock = MockServer::start(&[
        "--ttft",
        "20ms",
        "--itl",
        "10ms",
        "--tokens",
        "20",
        "--request-log",
        path_str(&arrivals),
    ]);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 12, 20, None);
    let report = dir.join("report.json");
    let mut run = Spawned::start(
        &bin("llm-replay"),
        &[
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--sweep-concurrency",
            "1,2",
            "--report-json",
            path_str(&report),
        ],
        &[],
    );
    // The first level takes 12 × ~0.2 s; its feeder read the file at once. Once its fourth
    // request arrived (0.6 s in, eight to go), break the file for the second level.
    assert!(
        eventually(Duration::from_secs(30), || request_log(&arrivals).len()
            >= 4),
        "the first level did not get going: {}",
        run.stderr()
    );
    assert!(
        request_log(&arrivals).len() < 12,
        "the first level ended before the file could be broken"
    );
    let mut text = std::fs::read_to_string(&recording).expect("read");
    text.insert_str(0, "{\"request\": 42}\n");
    std::fs::write(&recording, text).expect("write");
    let code = run.wait_timeout(Duration::from_secs(60));
    assert_eq!(code, Some(3), "{}\n{}", run.stdout(), run.stderr());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report written"))
            .expect("JSON");
    let sweep = report["sweep"].as_array().expect("sweep levels");
    assert_eq!(sweep.len(), 1, "{report:#}");
    assert_eq!(sweep[0]["concurrency"], 1);
    assert_eq!(num(&sweep[0], &["requests", "succeeded"]), 12.0);
    assert!(
        run.stdout().contains("the sweep stopped"),
        "{}",
        run.stdout()
    );
}

/// Item 25: a worker that leaves before the start frees its place; a restarted worker with
/// the same id takes it and the run completes.
#[test]
fn a_worker_that_leaves_before_the_start_can_be_replaced() {
    let _parallel = fixtures::parallel_lock();
    let mock = MockServer::start(&["--ttft", "2ms", "--itl", "1ms", "--tokens", "3"]);
    let dir = TempDir::new("rejoin");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 20, 3, None);
    let report_path = dir.join("report.json");
    let (mut coordinator, addr) = fixtures::coordinator(
        &[
            path_str(&recording),
            "--target",
            &mock.url,
            "--concurrency",
            "2",
            "--report-json",
            path_str(&report_path),
        ],
        2,
        &[],
    );
    let mut first = fixtures::worker(&addr, "w0", &[], &[]);
    assert!(
        fixtures::eventually(Duration::from_secs(20), || first.stdout().contains("ready")),
        "w0 did not join: {}",
        first.stderr()
    );
    first.kill();
    assert!(
        eventually(Duration::from_secs(20), || coordinator
            .stderr()
            .contains("its place is open again")),
        "the coordinator did not free w0's place: {}",
        coordinator.stderr()
    );
    let _again = fixtures::worker(&addr, "w0", &[], &[]);
    let _second = fixtures::worker(&addr, "w1", &[], &[]);
    let code = coordinator.wait_timeout(Duration::from_secs(60));
    assert_eq!(
        code,
        Some(0),
        "{}\n{}",
        coordinator.stdout(),
        coordinator.stderr()
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report_path).expect("report"))
            .expect("JSON");
    assert_eq!(num(&report, &["requests", "succeeded"]), 20.0, "{report:#}");
}

/// Item 21: handing a lost worker's exchanges to the survivor happens in the background:
/// heartbeats go on, the survivor is not timed out, and every exchange is replayed.
#[test]
fn reassignment_does_not_stall_the_coordinator() {
    let _timing = fixtures::timing_lock();
    let dir = TempDir::new("reassign-stall");
    let arrivals = dir.join("arrivals.jsonl");
    let mock = MockServer::start(&[
        "--ttft",
        "1ms",
        "--itl",
        "1ms",
        "--tokens",
        "1",
        "--request-log",
        path_str(&arrivals),
    ]);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 6000, 1, None);
    let report_path = dir.join("report.json");
    let (mut coordinator, addr) = fixtures::coordinator(
        &[
            path_str(&recording),
            "--target",
            &mock.url,
            "--concurrency",
            "2",
            "--on-worker-loss",
            "reassign",
            "--heartbeat-timeout",
            "1s",
            "--report-json",
            path_str(&report_path),
        ],
        2,
        &[],
    );
    let mut doomed = fixtures::worker(&addr, "doomed", &["--heartbeat-timeout", "1s"], &[]);
    let _survivor = fixtures::worker(&addr, "survivor", &["--heartbeat-timeout", "1s"], &[]);
    assert!(
        fixtures::eventually(Duration::from_secs(20), || doomed
            .stdout()
            .contains("ready")),
        "{}",
        doomed.stderr()
    );
    // Well into the run (a sixth of it), with most of the doomed worker's slice not started.
    assert!(
        eventually(Duration::from_secs(60), || request_log(&arrivals).len()
            >= 1000),
        "the run did not get going: {}",
        coordinator.stderr()
    );
    doomed.kill();
    let code = coordinator.wait_timeout(Duration::from_secs(120));
    assert_eq!(
        code,
        Some(0),
        "{}\n{}",
        coordinator.stdout(),
        coordinator.stderr()
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report_path).expect("report"))
            .expect("JSON");
    let total = num(&report, &["requests", "total"]);
    let not_started = num(&report, &["requests", "not_started"]);
    let lost = num(&report, &["requests", "lost"]);
    let succeeded = num(&report, &["requests", "succeeded"]);
    println!("total {total} succeeded {succeeded} lost {lost} not started {not_started}");
    assert_eq!(not_started, 0.0, "{report:#}");
    assert!(succeeded + lost >= 6000.0, "{report:#}");
}
