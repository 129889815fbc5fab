//! Acceptance of the server's side (issue 22): the coordinator scrapes the target's
//! Prometheus `/metrics` beside the load, and the report's `server` section agrees exactly
//! with what the client measured — against the real `llm-replay mock`, whose `/metrics`
//! counts its own state.

use std::path::Path;

use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, write_chat_recording};
use serde_json::Value;

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Output tokens and successes the `--requests-out` lines say the client received.
fn received(lines: &Path) -> (f64, usize) {
    let text = std::fs::read_to_string(lines).expect("requests-out");
    let mut tokens = 0.0;
    let mut succeeded = 0;
    for line in text.lines() {
        let line: Value = serde_json::from_str(line).expect("json line");
        if line["outcome"] == "succeeded" {
            succeeded += 1;
            tokens += line["output_tokens"].as_f64().expect("output_tokens");
        }
    }
    (tokens, succeeded)
}

/// Against the mock with 4 slots at concurrency 8: the scraped generation tokens equal the
/// tokens the run received, the server's TTFT histogram counted every request, running
/// peaked at 4 and some requests waited; a goal on the server's queue fails the run.
#[test]
fn the_server_section_agrees_with_what_the_client_received() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&[
        "--ttft",
        "20ms",
        "--itl",
        "5ms",
        "--tokens",
        "20",
        "--max-streams",
        "4",
    ]);
    let dir = TempDir::new("server-side");
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 40, 20, None);
    let lines = dir.join("requests.jsonl");
    let html = dir.join("report.html");
    let out = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &mock.url,
            "--concurrency",
            "8",
            "--workers",
            "2",
            "--requests",
            "80",
            "--server-metrics-interval",
            "100ms",
            "--requests-out",
            path_str(&lines),
            "--report-html",
            path_str(&html),
            "--fail-if",
            "server.vllm:num_requests_waiting.max > 0",
        ],
        Some(&dir.join("report.json")),
    );
    assert_eq!(
        out.code, 1,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report");
    let server = &report["server"];
    let metrics = &server["metrics"];
    let (tokens, succeeded) = received(&lines);
    assert_eq!(succeeded, 80, "{}", report["requests"]);
    assert_eq!(
        num(metrics, &["vllm:generation_tokens_total", "delta"]),
        tokens,
        "{server:#}"
    );
    assert_eq!(
        num(metrics, &["vllm:time_to_first_token_seconds", "count"]),
        80.0
    );
    assert_eq!(num(metrics, &["vllm:num_requests_running", "max"]), 4.0);
    assert!(num(metrics, &["vllm:num_requests_waiting", "max"]) >= 1.0);
    assert_eq!(metrics["vllm:num_requests_running"]["type"], "gauge");
    let endpoint = &server["endpoints"][0];
    assert_eq!(endpoint["url"], format!("{}/metrics", mock.url));
    assert!(num(endpoint, &["scrapes"]) >= 3.0, "{endpoint}");
    let goal = &report["goals"][0];
    assert_eq!(goal["failed"], true, "{goal}");
    assert!(goal["value"].as_f64().expect("value") >= 1.0);
    // Every renderer shows it: the terminal's Server section and the HTML's plots.
    assert!(out.stdout.contains("Server"), "{}", out.stdout);
    let page = std::fs::read_to_string(&html).expect("html");
    assert!(
        page.contains("plot-server-queue"),
        "the HTML plots the queue"
    );
}

/// An endpoint that is not Prometheus text, one that answers 404 and one that cannot be
/// reached are notes; the run replays normally (exit 0).
#[test]
fn odd_or_missing_metrics_endpoints_are_notes_not_failures() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "1ms", "--tokens", "5"]);
    let refused = fixtures::RefusedAddr::new();
    let unreachable = format!("{}/metrics", refused.url());
    let dir = TempDir::new("server-notes");
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 8, 5, None);
    let json_endpoint = format!("{}/v1/models", mock.url);
    let missing = format!("{}/no-metrics-here", mock.url);
    let out = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &mock.url,
            "--concurrency",
            "2",
            "--server-metrics",
            &json_endpoint,
            "--server-metrics",
            &missing,
            "--server-metrics",
            &unreachable,
        ],
        Some(&dir.join("report.json")),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report");
    assert_eq!(num(&report, &["requests", "succeeded"]), 8.0);
    let endpoints = report["server"]["endpoints"]
        .as_array()
        .expect("endpoints")
        .clone();
    assert_eq!(endpoints.len(), 4, "{endpoints:#?}");
    let note = |url: &str| -> String {
        endpoints
            .iter()
            .find(|e| e["url"] == url)
            .and_then(|e| e["note"].as_str())
            .unwrap_or_else(|| panic!("no note for {url}: {endpoints:#?}"))
            .to_owned()
    };
    assert!(note(&json_endpoint).contains("not Prometheus text"));
    assert!(note(&missing).contains("404"), "{}", note(&missing));
    assert!(note(&unreachable).contains("could not be fetched"));
    // The target's own endpoint still answered.
    assert!(report["server"]["metrics"]["vllm:generation_tokens_total"].is_object());

    // `--no-server-metrics` turns it off: no server section at all.
    let out = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &mock.url,
            "--no-server-metrics",
        ],
        Some(&dir.join("off.json")),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.report.expect("report").get("server").is_none());
}

/// A goal on a server metric the reachable endpoint never exposed is a usage error (exit 2);
/// one on a target whose metrics could not be scraped fails with a reason (exit 1).
#[test]
fn a_goal_on_a_metric_the_server_never_exposed() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "1ms", "--tokens", "5"]);
    let dir = TempDir::new("server-goal");
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 4, 5, None);
    let out = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &mock.url,
            "--fail-if",
            "server.vllm:no_such_metric.max > 1",
        ],
        Some(&dir.join("unknown.json")),
    );
    assert_eq!(
        out.code, 2,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    assert!(out.stderr.contains("vllm:no_such_metric"), "{}", out.stderr);

    let out = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &mock.url,
            "--no-server-metrics",
            "--fail-if",
            "server.vllm:num_requests_waiting.max > 10",
        ],
        Some(&dir.join("unscraped.json")),
    );
    assert_eq!(
        out.code, 1,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report");
    assert!(
        report["goals"][0]["note"]
            .as_str()
            .is_some_and(|n| n.contains("server")),
        "{}",
        report["goals"]
    );
}

/// A target whose `/metrics` is not Prometheus text (a gateway that answers every path with
/// its event stream) replays normally, with a note naming what it answered.
#[test]
fn a_target_without_prometheus_metrics_replays_with_a_note() {
    let _parallel = parallel_lock();
    let gateway = crate::raw_server::start_gateway(crate::raw_server::Gateway {
        content_type: Some("text/event-stream"),
        hold_after_done: std::time::Duration::ZERO,
        big_body: None,
    });
    let dir = TempDir::new("server-none");
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 3, 5, None);
    let out = llm_replay(
        &["run", path_str(&rec), "--target", &gateway.url],
        Some(&dir.join("report.json")),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report");
    assert_eq!(num(&report, &["requests", "succeeded"]), 3.0);
    let endpoint = &report["server"]["endpoints"][0];
    assert_eq!(endpoint["url"], format!("{}/metrics", gateway.url));
    let note = endpoint["note"].as_str().expect("a note");
    assert!(note.contains("not Prometheus text"), "{note}");
    assert!(
        report["server"]["metrics"]
            .as_object()
            .is_none_or(|m| m.is_empty()),
        "{}",
        report["server"]
    );
}

/// A run through the recording proxy scrapes the upstream's `/metrics` through it: the
/// scrapes reach the server and come back, and none of them is recorded (the recording holds
/// exactly the model requests).
#[test]
fn scrapes_through_the_recording_proxy_are_not_recorded() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "2ms", "--tokens", "10"]);
    let dir = TempDir::new("server-proxy");
    let recorded = dir.join("recorded.jsonl");
    let recorder = crate::capture::Recorder::start(&mock.url, &recorded, &[]);
    let source = dir.join("source.jsonl");
    write_chat_recording(&source, 20, 10, None);
    let out = llm_replay(
        &[
            "run",
            path_str(&source),
            "--target",
            &recorder.url,
            "--concurrency",
            "2",
            "--server-metrics-interval",
            "50ms",
        ],
        Some(&dir.join("report.json")),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    recorder.stop();
    let report = out.report.expect("report");
    assert!(num(&report["server"]["endpoints"][0], &["scrapes"]) >= 2.0);
    assert_eq!(
        num(
            &report["server"]["metrics"],
            &["vllm:time_to_first_token_seconds", "count"]
        ),
        20.0
    );
    let stats = crate::capture::stats_json(&recorded);
    assert_eq!(stats["exchanges"], serde_json::json!(20), "{stats:#}");
}
