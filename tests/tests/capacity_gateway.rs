//! Issue 32, item 11: through a gateway, the search finds the gateway's limit — and says so.
//! A real `llm-replay mock` of 32 slots behind the real test gateway
//! (`llm-replay-test-gateway`, LiteLLM's metric families on its `/metrics`) that lets 6
//! requests through at once: a `--find-max concurrency` search scraping both answers 6, and
//! its capacity section names the gateway as the tier whose queue moved at the knee while
//! the model server's queue stayed empty.

use std::path::Path;

use fixtures::gateway::Gateway;
use fixtures::{MockServer, TempDir, llm_replay, num, timing_lock, write_chat_recording};
use serde_json::Value;

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Each request takes 48 ms (TTFT 10 ms, 19 more tokens 2 ms apart) on a mock of 32 slots;
/// the gateway holds 6. At concurrency 7 one request in 7 waits a slot of the gateway
/// (≈ 48 ms, TTFT ≈ 58 ms), so `llm.ttft-p95 > 30` fails above 6; the mock's queue
/// (`vllm:num_requests_waiting`) stays 0 at every load probed. Probes of 1 s (80 requests
/// and more at concurrency 4) from concurrency 4 (`--concurrency 4`), the scrape every
/// 100 ms (ten samples a probe).
#[test]
fn a_search_through_a_gateway_names_the_gateway_as_the_limit() {
    let _timing = timing_lock();
    let mock = MockServer::start(&[
        "--ttft",
        "10ms",
        "--itl",
        "2ms",
        "--tokens",
        "20",
        "--max-streams",
        "32",
    ]);
    let gateway = Gateway::start(&mock.url, &["--limit", "6"]);
    let dir = TempDir::new("find-max-gateway");
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 200, 20, None);
    let mock_metrics = format!("{}/metrics", mock.url);
    let out = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &gateway.url,
            "--server-metrics",
            &mock_metrics,
            "--server-metrics-interval",
            "100ms",
            "--find-max",
            "concurrency",
            "--concurrency",
            "4",
            "--find-max-range",
            "1:64",
            "--duration",
            "1s",
            "--fail-if",
            "llm.ttft-p95 > 30",
        ],
        Some(&dir.join("gateway.json")),
    );
    let output = format!("{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.code, 0, "{output}");
    let report = out.report.expect("report");
    let capacity = &report["capacity"];
    assert_eq!(num(capacity, &["max"]), 6.0, "{capacity:#}");
    assert_eq!(capacity["limit_tier"]["tier"], "gateway", "{capacity:#}");
    let text = capacity["limit_tier"]["text"].as_str().expect("limit text");
    assert!(
        text.starts_with("the gateway is the limit")
            && text.contains("model server's queue max from 0 to 0"),
        "{text}"
    );
    assert!(
        output.contains("limit: the gateway is the limit"),
        "{output}"
    );
    // The gateway's figures are shown as the gateway's beside the server's queue.
    assert!(output.contains("· gateway: queue "), "{output}");
    // Every probe saw both tiers: the gateway's families and the mock's queue, empty.
    for probe in capacity["probes"].as_array().expect("probes") {
        let metrics = &probe["server"]["metrics"];
        assert_eq!(
            metrics["vllm:num_requests_waiting"]["max"], 0.0,
            "{probe:#}"
        );
        assert!(
            metrics["litellm_request_queue_time_seconds"]["count"]
                .as_f64()
                .is_some_and(|n| n > 0.0),
            "{metrics:#}"
        );
    }
    // The header states the search's whole time, not its answer probe's 2 s.
    assert_eq!(
        report["run"]["duration_s"], capacity["duration_s"],
        "{:#}",
        report["run"]
    );
    assert!(
        num(&report, &["run", "duration_s"]) > 6.0,
        "{:#}",
        report["run"]
    );
    let _: &Value = &report;
}
