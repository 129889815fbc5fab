//! Issue 32, item 3: a probe's verdict never rests on the maximum of a handful of requests.
//! Each probe runs until its goal's percentile has two requests beyond it (p95: 40), within
//! its budget's ceiling, and the report says when a verdict rests on fewer — against a real
//! `llm-replay mock` behind the real test gateway, which holds exactly one request 2 s.

use std::path::Path;

use fixtures::gateway::Gateway;
use fixtures::{MockServer, TempDir, llm_replay, num, timing_lock, write_chat_recording};
use serde_json::Value;

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Four slots of 115 ms (TTFT 20 ms, 19 more tokens 5 ms apart): 34.8 requests/s, far above
/// the rates searched here, behind the gateway whose 3rd request waits 2 s before it goes
/// upstream (TTFT ≈ 2,020 ms).
fn server_with_one_slow_request() -> (MockServer, Gateway) {
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
    let gateway = Gateway::start(&mock.url, &["--slow-request", "3", "--slow-by", "2000"]);
    (mock, gateway)
}

fn rate_search(
    gateway: &Gateway,
    dir: &TempDir,
    name: &str,
    budget: &[&str],
) -> (i32, Value, String) {
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 200, 20, None);
    let out = llm_replay(
        &[
            &[
                "run",
                path_str(&rec),
                "--target",
                &gateway.url,
                "--find-max",
                "rate",
                "--find-max-range",
                "10:20",
                "--arrival",
                "constant",
                "--no-server-metrics",
                "--fail-if",
                "llm.ttft-p95 > 60",
            ],
            budget,
        ]
        .concat(),
        Some(&dir.join(name)),
    );
    let output = format!("{}\n{}", out.stdout, out.stderr);
    (out.code, out.report.expect("report written"), output)
}

/// The lowest probe, 10 requests/s with `--duration 0.6s`, sent 6 requests before this item:
/// its p95 was their maximum, the one slow request's 2 s, and the search answered "even the
/// lowest load fails" (exit 1). Now the probe is sized for 40 judged requests (40 × 1.25 /
/// 10 = 5 s, within 10 × 0.6 s) and holds, with the slow request among them (its TTFT max
/// ≥ 1.9 s: the gateway held it 2 s); 20/s holds too, the top of the range. Tolerance: the
/// slow request's TTFT is its 2 s hold minus 100 ms.
#[test]
fn one_slow_request_no_longer_fails_the_lowest_load() {
    let _timing = timing_lock();
    let (_mock, gateway) = server_with_one_slow_request();
    let dir = TempDir::new("probe-needs-requests");
    let (code, report, output) = rate_search(&gateway, &dir, "sized.json", &["--duration", "0.6s"]);
    assert_eq!(code, 0, "{output}");
    let first = &report["capacity"]["probes"][0];
    assert_eq!(first["value"], 10.0, "{first:#}");
    assert_eq!(first["passed"], true, "{first:#}");
    let judged = num(first, &["llm", "ttft_ms", "count"]);
    assert!(
        judged >= 40.0,
        "the probe judged {judged} requests: {first:#}"
    );
    assert!(
        num(first, &["llm", "ttft_ms", "max"]) >= 1900.0,
        "the slow request was judged in this probe: {first:#}"
    );
    assert_eq!(first["few_requests"], Value::Null, "{first:#}");
    assert_eq!(report["capacity"]["max"], 20.0, "{:#}", report["capacity"]);
}

/// A `--requests 6` budget is the user's own count: the probe is not extended, and the
/// report says its verdict rests on 6 judged requests of the 40 its p95 needs — in the JSON
/// probe entry and on the terminal's probe table and notes.
#[test]
fn a_verdict_on_fewer_requests_than_needed_is_named() {
    let _timing = timing_lock();
    let (_mock, gateway) = server_with_one_slow_request();
    let dir = TempDir::new("probe-few-requests");
    let (_, report, output) = rate_search(&gateway, &dir, "few.json", &["--requests", "6"]);
    let first = &report["capacity"]["probes"][0];
    assert_eq!(first["requests"]["total"], 6, "{first:#}");
    let few = &first["few_requests"];
    assert_eq!(few["needed"], 40, "{first:#}");
    assert_eq!(few["goal"], "llm.ttft-p95 > 60", "{first:#}");
    let judged = num(few, &["judged"]);
    assert!((1.0..=6.0).contains(&judged), "{first:#}");
    assert!(
        output.contains(&format!("on {judged} of 40 requests")),
        "the probe table says it: {output}"
    );
    assert!(
        output.contains("rests on") && output.contains("needs 40"),
        "the notes say it: {output}"
    );
}
