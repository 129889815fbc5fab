//! Issue 33 items 9a and 9b: the server's own token counts.
//!
//! - A server that states its count in the stream's last chunk without a usage report
//!   (llama.cpp's `timings`: the mock's `--usage timings`, whose every 12th frame carries two
//!   tokens so its count differs from the frame count): the run's output tokens equal the
//!   server's count exactly, per request, with and without `--tokenizer`, and their source is
//!   `server`.
//! - `--request-usage` against a server that answers usage only when asked (the mock's
//!   `--usage requested`): every stream's counts are usage-reported, and the report says the
//!   replay asked; without the flag every one is estimated.
//!
//! Counts only, no timing tolerance: the mock streams fast (5 ms TTFT, 1 ms per frame).

use std::collections::BTreeMap;
use std::path::Path;

use fixtures::truth::TruthMock;
use fixtures::{TempDir, llm_replay, num, parallel_lock, test_data};
use serde_json::{Value, json};

/// Chat (and, every third, legacy completions) streams that do not ask for usage.
fn write_recording(path: &Path, n: usize) {
    let mut text = String::new();
    for i in 0..n {
        let (path, body) = if i % 3 == 2 {
            (
                "/v1/completions",
                json!({"model": "m", "stream": true, "max_tokens": 30,
                       "prompt": format!("Tell me about tides, part {i}.")}),
            )
        } else {
            (
                "/v1/chat/completions",
                json!({"model": "m", "stream": true, "max_tokens": 30,
                       "messages": [{"role": "user", "content": format!("Question {i}: why is the sky blue?")}]}),
            )
        };
        let line = json!({
            "id": format!("ex-{i}"),
            "request": {"method": "POST", "path": path,
                        "headers": {"content-type": "application/json"},
                        "body": body.to_string()},
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).expect("write the recording");
}

/// The `--requests-out` lines by exchange index.
fn requests_out(path: &Path) -> BTreeMap<u64, Value> {
    std::fs::read_to_string(path)
        .expect("the --requests-out file")
        .lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).expect("a JSON line");
            (value["index"].as_u64().expect("index"), value)
        })
        .collect()
}

/// Replay `n` exchanges against a mock started with `mock_args`, tagged so its truth log
/// pairs with `--requests-out`: the report, the requests and the mock's log by exchange.
fn replay(
    dir: &TempDir,
    n: usize,
    mock_args: &[&str],
    run_args: &[&str],
) -> (Value, String, BTreeMap<u64, Value>, BTreeMap<u64, Value>) {
    let log = dir.join(&format!("truth-{}.jsonl", run_args.len()));
    let mock = TruthMock::start(mock_args, &log);
    let recording = dir.join("rec.jsonl");
    write_recording(&recording, n);
    let out_path = dir.join(&format!("requests-{}.jsonl", run_args.len()));
    let report_path = dir.join(&format!("report-{}.json", run_args.len()));
    let mut args = vec![
        "run",
        recording.to_str().expect("utf-8 path"),
        "--target",
        &mock.url,
        "--concurrency",
        "4",
        "--tag-requests",
        "--no-server-metrics",
        "--requests-out",
        out_path.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(run_args);
    let out = llm_replay(&args, Some(&report_path));
    let truth: BTreeMap<u64, Value> = mock
        .stop_lines()
        .into_iter()
        .filter_map(|line| {
            let index = line["exchange"].as_str()?.parse().ok()?;
            Some((index, line))
        })
        .collect();
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    (
        out.report.expect("report JSON"),
        out.stdout,
        requests_out(&out_path),
        truth,
    )
}

/// Every request's output and input tokens are the server's stated ones, from `server`.
fn assert_server_counts(requests: &BTreeMap<u64, Value>, truth: &BTreeMap<u64, Value>) {
    assert_eq!(requests.len(), truth.len(), "one truth line per request");
    for (index, request) in requests {
        let served = &truth[index];
        assert_eq!(request["outcome"], "succeeded", "{request}");
        assert_eq!(
            request["output_tokens"], served["output_tokens"],
            "exchange {index}: the run's count {request} against the server's {served}"
        );
        assert_eq!(request["input_tokens"], served["input_tokens"], "{request}");
        assert_eq!(request["token_source"]["output"], "server", "{request}");
        assert_eq!(request["token_source"]["input"], "server", "{request}");
    }
}

#[test]
fn llama_cpp_timings_are_the_runs_token_counts_with_or_without_a_tokenizer() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("tokens-timings");
    let mock = [
        "--ttft", "5ms", "--itl", "1ms", "--tokens", "30", "--usage", "timings",
    ];
    let n = 12;
    let (report, stdout, requests, truth) = replay(&dir, n, &mock, &[]);
    assert_server_counts(&requests, &truth);
    // 30 tokens in 28 frames (frames 12 and 24 carry two): the frame count would be wrong.
    assert!(
        truth.values().all(|t| t["output_tokens"] == 30),
        "{truth:?}"
    );
    let sources = &report["requests"]["token_source"];
    assert_eq!(sources["output"]["server"], n as u64, "{sources}");
    assert_eq!(sources["output"]["frames"], 0, "{sources}");
    assert_eq!(sources["input"]["server"], n as u64, "{sources}");
    assert_eq!(num(&report, &["llm", "osl_tokens", "min"]), 30.0);
    assert_eq!(num(&report, &["llm", "estimated_token_share_pct"]), 0.0);
    assert!(stdout.contains("server-stated 12"), "{stdout}");

    let tokenizer = test_data("tokenizer.json");
    let tokenizer = tokenizer.to_str().expect("utf-8 path");
    let (report, _, requests, truth) = replay(&dir, n, &mock, &["--tokenizer", tokenizer]);
    assert_server_counts(&requests, &truth);
    let sources = &report["requests"]["token_source"];
    assert_eq!(sources["output"]["server"], n as u64, "{sources}");
    assert_eq!(sources["output"]["tokenizer"], 0, "{sources}");
    assert_eq!(num(&report, &["llm", "osl_tokens", "max"]), 30.0);
}

#[test]
fn request_usage_asks_openai_streams_for_the_servers_counts() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("tokens-request-usage");
    let mock = [
        "--ttft",
        "5ms",
        "--itl",
        "1ms",
        "--tokens",
        "20",
        "--usage",
        "requested",
    ];
    let n = 9;
    let (report, _, requests, _) = replay(&dir, n, &mock, &[]);
    assert_eq!(
        num(&report, &["requests", "estimated"]),
        n as f64,
        "without the flag the mock sends no usage"
    );
    assert!(
        requests
            .values()
            .all(|r| r["token_source"]["output"] == "frames")
    );

    let (report, stdout, requests, truth) = replay(&dir, n, &mock, &["--request-usage"]);
    assert_eq!(num(&report, &["requests", "usage_reported"]), n as f64);
    assert_eq!(num(&report, &["requests", "estimated"]), 0.0);
    assert_eq!(report["requests"]["token_source"]["usage_requested"], true);
    assert!(stdout.contains("(--request-usage)"), "{stdout}");
    for (index, request) in &requests {
        assert_eq!(request["token_source"]["output"], "usage", "{request}");
        assert_eq!(request["output_tokens"], truth[index]["output_tokens"]);
    }
}
