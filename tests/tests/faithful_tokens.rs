//! Acceptance of faithful replay, second step (issue 23): exact token counts without usage
//! (`--tokenizer` with the real tokenizer in `tests/data`), pins that match in the same unit,
//! recorded client cancellations replayed at their recorded point, `--cancel-rate`, and the
//! cold-cache warning — real `llm-replay mock`, `record` and `run` processes on loopback.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fixtures::truth::TruthMock;
use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, timing_lock};
use serde_json::{Value, json};

use crate::capture::Recorder;

fn tokenizer() -> PathBuf {
    fixtures::test_data("tokenizer.json")
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// A source recording of `max_tokens.len()` streamed OpenAI chat requests that do not ask for
/// usage (the SDKs' default), each with its own `max_tokens` and its own prompt.
fn write_source(path: &Path, max_tokens: &[u64]) {
    let mut out = std::fs::File::create(path).expect("create source");
    for (i, max) in max_tokens.iter().enumerate() {
        let body = json!({
            "model": "mock-model",
            "stream": true,
            "max_tokens": max,
            "messages": [
                {"role": "system", "content": "You are a careful assistant for tide tables."},
                {"role": "user", "content": format!("Question {i}: when is high tide at Brest, and why does it move by about fifty minutes a day?")},
            ],
        });
        let line = json!({
            "id": format!("ex-{i}"),
            "request": {"method": "POST", "path": "/v1/chat/completions",
                        "headers": {"content-type": "application/json"},
                        "body": body.to_string()},
        });
        writeln!(out, "{line}").expect("write source");
    }
}

/// The mock's truth log lines by `x-llm-replay-exchange` tag; `expected` of them.
fn truth_by_tag(lines: &[Value], expected: usize) -> BTreeMap<u64, Value> {
    let truth: BTreeMap<u64, Value> = lines
        .iter()
        .filter_map(|r| {
            let tag = r["exchange"].as_str()?.parse().ok()?;
            Some((tag, r.clone()))
        })
        .collect();
    assert_eq!(truth.len(), expected, "truth log {lines:#?}");
    truth
}

/// Record `source` through `llm-replay record` in front of a mock that sends no usage and
/// counts with the tokenizer; returns the recording.
fn record_without_usage(dir: &TempDir, max_tokens: &[u64]) -> PathBuf {
    let tok = tokenizer();
    let upstream = MockServer::start(&[
        "--ttft",
        "5ms",
        "--itl",
        "1ms",
        "--usage",
        "off",
        "--tokenizer",
        path_str(&tok),
    ]);
    let source = dir.join("source.jsonl");
    write_source(&source, max_tokens);
    let recorded = dir.join("recorded.jsonl");
    let recorder = Recorder::start(&upstream.url, &recorded, &[]);
    let out = llm_replay(
        &[
            "run",
            path_str(&source),
            "--target",
            &recorder.url,
            "--concurrency",
            "4",
            "--baseline",
            "none",
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    recorder.stop();
    recorded
}

#[test]
fn a_recording_without_usage_replays_with_exact_token_counts_and_pins_that_match() {
    let _cores = parallel_lock();
    let dir = TempDir::new("tokenizer-replay");
    let tok = tokenizer();
    let max_tokens: Vec<u64> = (0..24).map(|i| 5 + (i * 7) % 60).collect();
    let recorded = record_without_usage(&dir, &max_tokens);
    let lines = read_jsonl(&recorded);
    assert_eq!(lines.len(), max_tokens.len());
    for line in &lines {
        let frames = line["response"]["frames"].to_string();
        assert!(
            !frames.contains("completion_tokens"),
            "the recording has no usage: {line}"
        );
    }

    // `recording stats` and `export aiperf` count the recorded answers with the tokenizer.
    let stats = llm_replay(
        &[
            "recording",
            "stats",
            path_str(&recorded),
            "--json",
            "--tokenizer",
            path_str(&tok),
        ],
        None,
    );
    assert_eq!(stats.code, 0, "{}", stats.stderr);
    let stats: Value = serde_json::from_str(&stats.stdout).expect("stats JSON");
    let asked: u64 = max_tokens.iter().sum();
    let osl_sum = stats["osl_tokens"]["avg"].as_f64().expect("OSL avg") * lines.len() as f64;
    assert!(
        (osl_sum - asked as f64).abs() < 0.5,
        "recorded OSL by the tokenizer {osl_sum} vs {asked} generated: {stats:#}"
    );
    let exported = dir.join("aiperf.jsonl");
    let export = llm_replay(
        &[
            "export",
            "aiperf",
            path_str(&recorded),
            "-o",
            path_str(&exported),
            "--tokenizer",
            path_str(&tok),
        ],
        None,
    );
    assert_eq!(export.code, 0, "{}", export.stderr);
    let mut lengths: Vec<u64> = read_jsonl(&exported)
        .iter()
        .map(|l| l["output_length"].as_u64().expect("output_length"))
        .collect();
    let mut expected = max_tokens.clone();
    lengths.sort_unstable();
    expected.sort_unstable();
    assert_eq!(lengths, expected, "export's output_length by the tokenizer");

    // The replay against a mock that sends no usage: output tokens by the tokenizer equal
    // the mock's own count of the same streams, and every pin matches.
    let truth = dir.join("truth.jsonl");
    let target = TruthMock::start(
        &[
            "--ttft",
            "5ms",
            "--itl",
            "1ms",
            "--usage",
            "off",
            "--tokenizer",
            path_str(&tok),
        ],
        &truth,
    );
    let report = dir.join("report.json");
    let requests = dir.join("requests.jsonl");
    let out = llm_replay(
        &[
            "run",
            path_str(&recorded),
            "--target",
            &target.url,
            "--tag-requests",
            "--concurrency",
            "4",
            "--tokenizer",
            path_str(&tok),
            "--pin-output-length",
            "--requests-out",
            path_str(&requests),
        ],
        Some(&report),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let served = target.stop_lines(); // the truth log is written at shutdown
    let report = out.report.expect("report");
    let truth = truth_by_tag(&served, lines.len());
    let records = read_jsonl(&requests);
    assert_eq!(records.len(), lines.len());
    for record in &records {
        let index = record["index"].as_u64().expect("index");
        let served = &truth[&index];
        assert_eq!(
            record["output_tokens"], served["output_tokens"],
            "replayed count vs the mock's: {record} {served}"
        );
        assert_eq!(record["token_source"]["output"], "tokenizer", "{record}");
        assert_eq!(record["token_source"]["input"], "tokenizer", "{record}");
        assert_eq!(
            record["input_tokens"], served["input_tokens"],
            "input by the tokenizer vs the mock's: {record} {served}"
        );
    }
    let r = &report["requests"];
    assert_eq!(num(&report, &["requests", "pinned"]), lines.len() as f64);
    assert_eq!(r["pinned"], r["pinned_matched"], "{r:#}");
    assert_eq!(report["faithful"]["pin_unit"], "tokens", "{report:#}");
    assert_eq!(
        num(
            &report,
            &["requests", "token_source", "output", "tokenizer_pct"]
        ),
        100.0
    );
    // The frames undercount: the same streams counted one token per frame would be fewer.
    let frames: u64 = truth
        .values()
        .map(|t| t["frames"].as_u64().unwrap_or(0))
        .sum();
    let tokens: u64 = truth
        .values()
        .map(|t| t["output_tokens"].as_u64().unwrap_or(0))
        .sum();
    assert!(frames < tokens, "frames {frames} vs tokens {tokens}");

    // Without the tokenizer the pins are frame counts: said so, and compared with frames.
    let report2 = dir.join("report-frames.json");
    let target = MockServer::start(&["--ttft", "5ms", "--itl", "1ms", "--usage", "off"]);
    let out = llm_replay(
        &[
            "run",
            path_str(&recorded),
            "--target",
            &target.url,
            "--concurrency",
            "4",
            "--pin-output-length",
        ],
        Some(&report2),
    );
    assert!(out.code == 0 || out.code == 1, "{}", out.stderr);
    let report2 = out.report.expect("report");
    assert_eq!(report2["faithful"]["pin_unit"], "frames", "{report2:#}");
    assert_eq!(
        num(&report2, &["requests", "pinned_frames"]),
        lines.len() as f64
    );
    let warnings = report2["warnings"].to_string();
    assert!(
        warnings.contains("frame counts"),
        "the report says the pins are frame counts: {warnings}"
    );
}

/// One streamed chat request through `addr`: read until `cancel_after` (then close the
/// socket, as a user pressing stop) or to the end of the stream.
fn chat_client(addr: &str, i: usize, cancel_after: Option<Duration>) {
    let body = json!({
        "model": "mock-model",
        "stream": true,
        "max_tokens": 30,
        "messages": [{"role": "user", "content": format!("Question {i}: explain the tides")}],
    })
    .to_string();
    let host = addr.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).expect("connect to the recorder");
    stream.set_nodelay(true).expect("nodelay");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let sent = Instant::now();
    stream
        .write_all(format!("{head}{body}").as_bytes())
        .expect("send");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let wait = match cancel_after {
            Some(after) => match after.checked_sub(sent.elapsed()) {
                Some(left) if !left.is_zero() => left,
                _ => break,
            },
            None => Duration::from_secs(10),
        };
        stream.set_read_timeout(Some(wait)).expect("timeout");
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                seen.extend_from_slice(&buf[..n]);
                if String::from_utf8_lossy(&seen).contains("[DONE]") {
                    break;
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                continue;
            }
            Err(e) => panic!("read: {e}"),
        }
    }
    // Dropping the socket closes it: the user pressed stop (or the answer is whole).
}

#[test]
fn recorded_cancellations_replay_at_their_recorded_point() {
    let _cores = timing_lock();
    let dir = TempDir::new("cancel-replay");
    // 30 tokens: role frame at once, first token at 100 ms, then one every 20 ms (~680 ms).
    let mock_args = ["--ttft", "100ms", "--itl", "20ms", "--http1-only"];
    let upstream = MockServer::start(&mock_args);
    let recorded = dir.join("recorded.jsonl");
    let recorder = Recorder::start(&upstream.url, &recorded, &[]);
    // Users who press stop: before the first token, early, mid-stream, late. The ten users
    // ask at once (0.7 s, where one after another took 5 s): each cancel point is recorded
    // by the proxy, relative to its own request, and the replay sends all ten at once too.
    let cancels: BTreeMap<usize, u64> = [(1, 60), (3, 180), (6, 310), (8, 470)].into();
    std::thread::scope(|users| {
        for i in 0..10 {
            let (url, cancel_after) = (
                &recorder.url,
                cancels.get(&i).map(|ms| Duration::from_millis(*ms)),
            );
            users.spawn(move || chat_client(url, i, cancel_after));
        }
    });
    // The proxy finishes a cut exchange when it notices the client gone.
    assert!(fixtures::eventually(Duration::from_secs(5), || {
        std::fs::read_to_string(&recorded)
            .map(|t| t.lines().count() >= 10)
            .unwrap_or(false)
    }));
    recorder.stop();
    let lines = read_jsonl(&recorded);
    assert_eq!(lines.len(), 10);
    let mut recorded_points = BTreeMap::new();
    for (index, line) in lines.iter().enumerate() {
        let response = &line["response"];
        if response["ended"] == "client disconnected" {
            let at = response["cancelled_ms"]
                .as_f64()
                .unwrap_or_else(|| panic!("a cancelled exchange says when: {response}"));
            recorded_points.insert(index as u64, at);
        }
    }
    assert_eq!(recorded_points.len(), cancels.len(), "{lines:#?}");

    // Replay against the same timing; the mock logs when the server saw each cancel.
    let truth = dir.join("truth.jsonl");
    let request_log = dir.join("requests.log");
    let target = TruthMock::start(
        &[&mock_args[..], &["--request-log", path_str(&request_log)]].concat(),
        &truth,
    );
    let report = dir.join("report.json");
    let requests = dir.join("requests.jsonl");
    let out = llm_replay(
        &[
            "run",
            path_str(&recorded),
            "--target",
            &target.url,
            "--tag-requests",
            "--concurrency",
            "10",
            "--requests-out",
            path_str(&requests),
        ],
        Some(&report),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let served = target.stop_lines();
    let report = out.report.expect("report");
    assert_eq!(
        num(&report, &["requests", "cancelled_as_recorded"]),
        cancels.len() as f64,
        "{:#}",
        report["requests"]
    );
    assert_eq!(num(&report, &["requests", "succeeded"]), 6.0);
    assert_eq!(num(&report, &["requests", "failed"]), 0.0);
    assert_eq!(num(&report, &["requests", "ended_early"]), 0.0);
    assert_eq!(num(&report, &["requests", "total"]), 10.0);
    let truth = truth_by_tag(&served, 10);
    let mut errors = Vec::new();
    for (index, recorded_ms) in &recorded_points {
        let served = &truth[index];
        let cancelled_ns = served["cancelled_ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("the mock saw exchange {index} cancelled: {served}"));
        let head_ns = served["head_ns"].as_u64().expect("head_ns");
        let replayed_ms = (cancelled_ns - head_ns) as f64 / 1e6;
        errors.push((index, replayed_ms - recorded_ms));
    }
    eprintln!("cancel point errors, replayed − recorded (ms): {errors:?}");
    for (index, error) in &errors {
        assert!(
            error.abs() <= 2.0,
            "exchange {index}: cancelled {error:+.3} ms from its recorded point (all: {errors:?})"
        );
    }
    for (index, served) in &truth {
        if !recorded_points.contains_key(index) {
            assert!(served["cancelled_ns"].is_null(), "{served}");
        }
    }
    // The mock's own request log shows each cancel.
    let cancelled_lines: Vec<Value> = read_jsonl(&request_log)
        .into_iter()
        .filter(|l| l["event"] == "cancelled")
        .collect();
    assert_eq!(cancelled_lines.len(), cancels.len(), "{cancelled_lines:#?}");
    // TTFT counts for the cancels after the first token, nothing else does.
    let records = read_jsonl(&requests);
    for record in &records {
        let index = record["index"].as_u64().expect("index");
        if let Some(at) = recorded_points.get(&index) {
            assert_eq!(record["outcome"], "cancelled_as_recorded", "{record}");
            assert!(record["latency_ms"].is_null(), "{record}");
            assert_eq!(record["ttft_ms"].is_null(), *at < 100.0, "{record}");
        } else {
            assert_eq!(record["outcome"], "succeeded", "{record}");
        }
    }
    assert_eq!(
        num(&report, &["llm", "ttft_ms", "count"]),
        6.0 + recorded_points.values().filter(|at| **at >= 100.0).count() as f64
    );
}

#[test]
fn cancel_rate_cancels_a_deterministic_share() {
    let _cores = parallel_lock();
    let dir = TempDir::new("cancel-rate");
    let recording = dir.join("rec.jsonl");
    fixtures::write_chat_recording(&recording, 60, 10, None);
    let target = MockServer::start(&["--ttft", "30ms", "--itl", "5ms"]);
    let run = |seed: &str| {
        let report = dir.join(&format!("report-{seed}.json"));
        let out = llm_replay(
            &[
                "run",
                path_str(&recording),
                "--target",
                &target.url,
                "--concurrency",
                "20",
                "--cancel-rate",
                "50%",
                "--cancel-after",
                "40ms",
                "--seed",
                seed,
            ],
            Some(&report),
        );
        assert_eq!(out.code, 0, "{}", out.stderr);
        out.report.expect("report")
    };
    let first = run("7");
    let again = run("7");
    let cancelled = num(&first, &["requests", "cancelled_by_rate"]);
    assert!(
        (15.0..=45.0).contains(&cancelled),
        "about half of 60: {cancelled}"
    );
    assert_eq!(cancelled, num(&again, &["requests", "cancelled_by_rate"]));
    assert_eq!(num(&first, &["requests", "cancelled_as_recorded"]), 0.0);
    assert_eq!(
        num(&first, &["requests", "succeeded"]) + cancelled,
        60.0,
        "{:#}",
        first["requests"]
    );
    // A rate outside 0–100 % is a usage error.
    let bad = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &target.url,
            "--cancel-rate",
            "120",
        ],
        None,
    );
    assert_eq!(bad.code, 2, "{}", bad.stderr);
}

#[test]
fn a_cold_replay_that_reports_cached_input_is_warned() {
    let _cores = parallel_lock();
    let dir = TempDir::new("cold-cache");
    // A recording whose answers report 60 of 100 input tokens served from the cache, served
    // back by the mock at their recorded timing.
    let recording = dir.join("cached.jsonl");
    let mut out = std::fs::File::create(&recording).expect("create");
    for i in 0..5 {
        let body = json!({"model": "m", "stream": true, "cache_prompt": true,
            "messages": [{"role": "user", "content": format!("q{i}")}]});
        let chunk = json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {"content": "tide"}, "finish_reason": null}]});
        let usage = json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 1,
            "total_tokens": 101, "prompt_tokens_details": {"cached_tokens": 60}}});
        let line = json!({
            "id": format!("c{i}"),
            "request": {"method": "POST", "path": "/v1/chat/completions",
                        "headers": {"content-type": "application/json"},
                        "body": body.to_string()},
            "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
                "frames": [{"t_ms": 10.0, "data": format!("data: {chunk}\n\n")},
                           {"t_ms": 12.0, "data": format!("data: {usage}\n\ndata: [DONE]\n\n")}],
                "complete": true},
        });
        writeln!(out, "{line}").expect("write");
    }
    drop(out);
    let mock = MockServer::start(&["--recording", path_str(&recording)]);
    let run = |extra: &[&str], name: &str| {
        let mut args = vec![
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--tag-requests",
        ];
        args.extend_from_slice(extra);
        let out = llm_replay(&args, Some(&dir.join(name)));
        assert_eq!(out.code, 0, "{}", out.stderr);
        out.report.expect("report")
    };
    let cold = run(&["--set", "cache_prompt=false"], "cold.json");
    assert_eq!(num(&cold, &["llm", "cached_input_share_pct"]), 60.0);
    let warnings = cold["warnings"].to_string();
    assert!(
        warnings.contains("cold prompt cache") && warnings.contains("60.0 %"),
        "{warnings}"
    );
    // Not meant to be cold: the same share is no surprise.
    let warm = run(&[], "warm.json");
    assert!(
        !warm["warnings"].to_string().contains("cold prompt cache"),
        "{:#}",
        warm["warnings"]
    );
}
