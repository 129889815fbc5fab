//! Real traffic, measured right: non-streamed answers beside streams, streams behind gateways
//! that mislabel them or hold the connection open, recordings whose lines are out of arrival
//! order, the prompt-cache share, and per-request records merged from several workers.
//!
//! The servers are real sockets: `llm-replay mock`, the embedded mock serving a recording's own
//! frames at their recorded offsets, and a raw HTTP/1.1 server written here for the gateway
//! behaviours the mock does not have.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::raw_server::{Gateway, start_gateway};

use fixtures::{MockServer, TempDir, bin, llm_replay, num, write_chat_recording};
use serde_json::{Value, json};

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn write_lines(path: &Path, lines: &[Value]) {
    let mut text = String::new();
    for line in lines {
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).expect("write recording");
}

fn chat_body(stream: bool, max_tokens: u32) -> String {
    json!({
        "model": "m",
        "stream": stream,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Tell me about tides."}],
    })
    .to_string()
}

/// An OpenAI chat SSE response: `tokens` content frames from `ttft_ms`, `itl_ms` apart, then a
/// usage chunk and `[DONE]`.
fn sse_response(ttft_ms: f64, itl_ms: f64, tokens: u32, usage: Value) -> Value {
    let mut frames = Vec::new();
    let mut t = ttft_ms;
    for _ in 0..tokens {
        frames.push(json!({"t_ms": t, "data": "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word \"}}]}\n\n"}));
        t += itl_ms;
    }
    let usage_chunk = json!({"choices": [], "usage": usage});
    frames.push(json!({"t_ms": t - itl_ms + 0.2, "data": format!("data: {usage_chunk}\n\ndata: [DONE]\n\n")}));
    json!({"status": 200, "headers": {"content-type": "text/event-stream"}, "frames": frames, "complete": true})
}

/// Acceptance (issue 11): 15 streamed and 15 non-streamed exchanges replayed against the
/// embedded mock. A non-streamed answer has a latency but no TTFT, so TTFT counts 15 and
/// latency 30, each within 3 % of the recording's own baseline.
#[test]
fn unstreamed_answers_count_in_latency_only_and_match_the_baseline() {
    let _timing = fixtures::timing_lock();
    fixtures::remeasure(
        "streamed and unstreamed against their baseline",
        measure_unstreamed_mix,
    );
}

/// One replay of the mixed recording: `Err` with the changes when one is over 3 %.
fn measure_unstreamed_mix() -> Result<(), String> {
    let dir = TempDir::new("unstreamed");
    let recording = dir.join("mixed.jsonl");
    let mut lines = Vec::new();
    for i in 0..30u32 {
        let streamed = i % 2 == 0;
        let response = if streamed {
            sse_response(
                100.0 + f64::from(i),
                5.0,
                20,
                json!({"prompt_tokens": 12, "completion_tokens": 20}),
            )
        } else {
            let body = json!({"id": "c", "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "word ".repeat(20)}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 20}});
            json!({"status": 200, "headers": {"content-type": "application/json"},
                "frames": [{"t_ms": 150.0 + f64::from(i), "data": body.to_string()}], "complete": true})
        };
        lines.push(json!({
            "id": format!("x{i}"),
            "at_ms": f64::from(i) * 40.0,
            "request": {"method": "POST", "path": "/v1/chat/completions",
                        "headers": {"content-type": "application/json"},
                        "body": chat_body(streamed, 20)},
            "response": response,
        }));
    }
    write_lines(&recording, &lines);
    let report_path = dir.join("report.json");
    let out = llm_replay(&["run", path_str(&recording)], Some(&report_path));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report = out.report.expect("report");
    println!(
        "ttft count {} latency count {} unstreamed {}",
        num(&report, &["llm", "ttft_ms", "count"]),
        num(&report, &["llm", "latency_ms", "count"]),
        num(&report, &["requests", "unstreamed"])
    );
    assert_eq!(num(&report, &["requests", "succeeded"]), 30.0);
    assert_eq!(num(&report, &["requests", "unstreamed"]), 15.0);
    assert_eq!(num(&report, &["llm", "ttft_ms", "count"]), 15.0);
    assert_eq!(num(&report, &["llm", "itl_ms", "count"]), 15.0);
    assert_eq!(num(&report, &["llm", "latency_ms", "count"]), 30.0);
    assert_eq!(num(&report, &["llm", "osl_tokens", "count"]), 30.0);
    assert_eq!(num(&report, &["baseline", "llm", "ttft_ms", "count"]), 15.0);
    assert_eq!(
        num(&report, &["baseline", "llm", "latency_ms", "count"]),
        30.0
    );
    for key in [
        "ttft_ms.p50",
        "ttft_ms.p95",
        "latency_ms.p50",
        "latency_ms.p95",
    ] {
        let change = num(&report, &["baseline", "changes", key, "change_pct"]);
        println!("{key} change {change:+.2} %");
        if change.abs() > 3.0 {
            return Err(format!("{key} changed {change:.2} % (±3 %)"));
        }
    }
    Ok(())
}

fn replay_against(url: &str, dir: &TempDir, extra: &[&str]) -> Value {
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 12, 5, None);
    let report_path = dir.join("report.json");
    let mut args = vec![
        "run",
        path_str(&recording),
        "--target",
        url,
        "--concurrency",
        "3",
    ];
    args.extend_from_slice(extra);
    let out = llm_replay(&args, Some(&report_path));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    out.report.expect("report")
}

/// Acceptance (issue 11): SSE served as `text/plain`, and with no content type at all, is
/// measured as a stream (it used to fail as "transport").
#[test]
fn sse_behind_a_gateway_that_mislabels_it_is_measured() {
    let _parallel = fixtures::parallel_lock();
    for content_type in [Some("text/plain; charset=utf-8"), None] {
        let url = start_gateway(Gateway {
            content_type,
            hold_after_done: Duration::ZERO,
            big_body: None,
        })
        .url;
        let dir = TempDir::new("mislabelled");
        let report = replay_against(&url, &dir, &[]);
        println!(
            "{content_type:?}: succeeded {} ttft p50 {} ms",
            num(&report, &["requests", "succeeded"]),
            num(&report, &["llm", "ttft_ms", "p50"])
        );
        assert_eq!(num(&report, &["requests", "succeeded"]), 12.0);
        assert_eq!(num(&report, &["requests", "failed"]), 0.0);
        assert_eq!(num(&report, &["llm", "ttft_ms", "count"]), 12.0);
        assert_eq!(num(&report, &["llm", "osl_tokens", "p50"]), 5.0);
        assert_eq!(num(&report, &["requests", "unstreamed"]), 0.0);
    }
}

/// Acceptance (issue 11): a stream held open after `[DONE]` ends at `[DONE]`: no timeout, and
/// its latency is the stream's (~50 ms), not the hold (3 s).
#[test]
fn a_stream_held_open_after_done_ends_at_done() {
    let _parallel = fixtures::parallel_lock();
    let url = start_gateway(Gateway {
        content_type: Some("text/event-stream"),
        hold_after_done: Duration::from_secs(3),
        big_body: None,
    })
    .url;
    let dir = TempDir::new("held-open");
    let report = replay_against(&url, &dir, &["--timeout", "2s"]);
    let latency_max = num(&report, &["llm", "latency_ms", "max"]);
    println!("latency max {latency_max:.1} ms");
    assert_eq!(num(&report, &["requests", "succeeded"]), 12.0);
    assert_eq!(
        num(&report, &["requests", "failed_by_kind", "timeout"]),
        0.0
    );
    assert!(latency_max < 1000.0, "latency max {latency_max} ms");
}

/// 60 exchanges 20 ms apart whose lines are written in blocks of 10 reversed, the way a
/// recording proxy writes exchanges as they complete.
fn write_out_of_order_recording(path: &Path) {
    let mut lines = Vec::new();
    for block in 0..6u32 {
        for i in (0..10u32).rev() {
            let n = block * 10 + i;
            lines.push(json!({
                "id": format!("o{n}"),
                "at_ms": f64::from(n) * 20.0,
                "request": {"method": "POST", "path": "/v1/chat/completions",
                            "headers": {"content-type": "application/json"},
                            "body": chat_body(true, 5)},
            }));
        }
    }
    write_lines(path, &lines);
}

/// Acceptance (issue 11): the recorded schedule follows `at_ms` whatever the order of lines,
/// within the reorder window; beyond it an exchange is sent late and counted, never dropped.
/// `recording stats` tells how out of order a file is. Both replays go at `--speed 2` (10 ms
/// gaps, 0.6 s instead of 1.2): the window counts exchanges, not milliseconds, so the same
/// lines are in reach of it, or not, at any speed.
#[test]
fn recorded_schedule_follows_at_ms_whatever_the_line_order() {
    let _timing = fixtures::timing_lock();
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "1ms", "--tokens", "5"]);
    let dir = TempDir::new("order");
    let recording = dir.join("proxy-order.jsonl");
    write_out_of_order_recording(&recording);

    let stats = std::process::Command::new(bin("llm-replay"))
        .args(["recording", "stats", path_str(&recording), "--json"])
        .output()
        .expect("stats runs");
    assert!(stats.status.success());
    let stats: Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    assert_eq!(stats["order"]["out_of_order"], 54, "{stats:#}");
    assert_eq!(stats["order"]["window_needed"], 10, "{stats:#}");
    assert_eq!(stats["order"]["max_behind_ms"], 180.0, "{stats:#}");

    let report_path = dir.join("report.json");
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--speed",
            "2",
        ],
        Some(&report_path),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report = out.report.expect("report");
    let lag_p99 = num(&report, &["llm", "schedule_lag_ms", "p99"]);
    println!("in order: schedule lag p99 {lag_p99:.2} ms");
    assert!(lag_p99 < 5.0, "schedule lag p99 {lag_p99} ms");
    assert_eq!(num(&report, &["requests", "succeeded"]), 60.0);
    assert!(!out.stdout.contains("saturated"), "{}", out.stdout);
    assert!(!out.stdout.contains("reorder-window"), "{}", out.stdout);

    // A window too small for this file: late, counted, none dropped.
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--speed",
            "2",
            "--reorder-window",
            "3",
        ],
        Some(&report_path),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report = out.report.expect("report");
    assert_eq!(num(&report, &["requests", "succeeded"]), 60.0);
    assert!(
        out.stdout.contains("--reorder-window 3"),
        "no out-of-order warning: {}",
        out.stdout
    );
}

/// Acceptance (issue 11): `--requests-out` with 2 workers writes one line per request, every
/// exchange once, both workers named; the median TTFT of the lines equals the report's p50
/// within 1 %.
#[test]
fn requests_out_has_one_line_per_request_from_every_worker() {
    // Each line's ITL is checked against the mock's 2 ms, so this run must not share the
    // cores with the heavy tests (CI once saw 4.1 ms here under the shared guard).
    let _timing = fixtures::timing_lock();
    let mock = MockServer::start(&["--ttft", "20ms", "--itl", "2ms", "--tokens", "10"]);
    let dir = TempDir::new("requests-out");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 200, 10, None);
    let records = dir.join("requests.jsonl");
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--workers",
            "2",
            "--concurrency",
            "8",
            "--requests-out",
            path_str(&records),
        ],
        Some(&report_path),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report = out.report.expect("report");
    let lines: Vec<Value> = std::fs::read_to_string(&records)
        .expect("requests-out written")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 200);
    let exchanges: BTreeSet<&str> = lines
        .iter()
        .map(|l| l["exchange"].as_str().expect("exchange id"))
        .collect();
    assert_eq!(exchanges.len(), 200, "every exchange once");
    assert!(exchanges.contains("ex-0") && exchanges.contains("ex-199"));
    let workers: BTreeSet<&str> = lines
        .iter()
        .map(|l| l["worker"].as_str().expect("worker"))
        .collect();
    assert_eq!(workers.len(), 2, "{workers:?}");
    for line in &lines {
        assert_eq!(line["outcome"], "succeeded", "{line}");
        assert_eq!(line["status"], 200, "{line}");
        assert_eq!(line["output_tokens"], 10, "{line}");
        assert_eq!(line["token_source"]["output"], "usage", "{line}");
        assert_eq!(line["token_source"]["input"], "usage", "{line}");
        assert!(
            line["sent_unix_ms"].as_f64().expect("sent") > 1.6e12,
            "{line}"
        );
        // Each line carries its own request's numbers: its ITL is its own (latency - TTFT)
        // spread over the frames after the first. Not each line's ITL against the mock's
        // 2 ms: one stall of the shared machine in one stream of 200 (CI once saw 13 ms,
        // ITL 3.4 ms) says nothing about the records; the lines' median below is the timing.
        let itl = line["itl_ms"].as_f64().expect("itl");
        let own = (line["latency_ms"].as_f64().expect("latency")
            - line["ttft_ms"].as_f64().expect("ttft"))
            / 9.0;
        assert!(
            (itl - own).abs() < 0.001,
            "ITL {own} from its own times: {line}"
        );
        for key in ["ttst_ms", "latency_ms", "input_tokens"] {
            assert!(line[key].is_number(), "{key}: {line}");
        }
    }
    let mut ttfts: Vec<f64> = lines
        .iter()
        .map(|l| l["ttft_ms"].as_f64().expect("ttft"))
        .collect();
    ttfts.sort_by(f64::total_cmp);
    let median = ttfts[(ttfts.len() - 1) / 2];
    let p50 = num(&report, &["llm", "ttft_ms", "p50"]);
    println!("median of lines {median:.3} ms, report p50 {p50:.3} ms");
    let mut itls: Vec<f64> = lines
        .iter()
        .map(|l| l["itl_ms"].as_f64().expect("itl"))
        .collect();
    itls.sort_by(f64::total_cmp);
    let itl_median = itls[(itls.len() - 1) / 2];
    assert!(
        (itl_median - 2.0).abs() < 1.0,
        "the lines' median ITL {itl_median} ms against the mock's 2 ms"
    );
    assert!(
        (median - p50).abs() / p50 <= 0.01,
        "median {median} vs p50 {p50}"
    );
}

/// Acceptance (issue 11): the cached input tokens a server reports give
/// `llm.cached_input_share_pct`, and a goal can gate on it.
#[test]
fn prompt_cache_share_is_reported_and_gated() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("cache");
    let recording = dir.join("cached.jsonl");
    let lines: Vec<Value> = (0..10u32)
        .map(|i| {
            json!({
                "at_ms": f64::from(i) * 10.0,
                "request": {"method": "POST", "path": "/v1/chat/completions",
                            "headers": {"content-type": "application/json"},
                            "body": chat_body(true, 5)},
                "response": sse_response(20.0, 2.0, 5, json!({
                    "prompt_tokens": 100, "completion_tokens": 5,
                    "prompt_tokens_details": {"cached_tokens": if i < 5 { 80 } else { 0 }}})),
            })
        })
        .collect();
    write_lines(&recording, &lines);
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--fail-if",
            "llm.cached-input-share > 30",
        ],
        Some(&report_path),
    );
    let report = out.report.expect("report");
    let share = num(&report, &["llm", "cached_input_share_pct"]);
    println!("cached input share {share:.1} %");
    assert!((share - 40.0).abs() < 1e-9, "{share}");
    assert_eq!(
        out.code, 1,
        "the goal holds, so the run fails: {}",
        out.stdout
    );
    assert!(out.stdout.contains("prompt cache 40.0 % of input"));
}
