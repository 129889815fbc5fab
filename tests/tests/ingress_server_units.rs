//! Server time goals in one unit (issue 33, item 12): every time a goal reads is in ms, a
//! histogram whose family is in seconds (`vllm:time_to_first_token_seconds`) converted, so a
//! goal written in ms against the server's TTFT can fail — against the real `llm-replay mock`,
//! whose `/metrics` serves vLLM's seconds histograms.

use std::path::Path;

use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, write_chat_recording};

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The mock's TTFT is 20 ms: its `vllm:time_to_first_token_seconds` observations fall in
/// vLLM's (0.02, 0.04] s bucket, so the server's p90 is 20-40 ms. `p90 > 1` (ms) fails the run
/// (exit 1) and `p90 > 100` holds; the report gives the family in ms with `unit: "ms"`, and
/// the terminal's Server table shows the very number the goal read.
#[test]
fn a_server_goal_on_a_histogram_of_seconds_reads_ms_and_fails() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "20ms", "--itl", "2ms", "--tokens", "5"]);
    let dir = TempDir::new("ingress-units");
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 12, 5, None);
    let out = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &mock.url,
            "--schedule",
            "asap",
            "--concurrency",
            "2",
            "--server-metrics-interval",
            "100ms",
            "--fail-if",
            "server.vllm:time_to_first_token_seconds.p90 > 1",
            "--fail-if",
            "server.vllm:time_to_first_token_seconds.p90 > 100",
        ],
        Some(&dir.join("report.json")),
    );
    assert_eq!(
        out.code, 1,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report");
    let ttft = &report["server"]["metrics"]["vllm:time_to_first_token_seconds"];
    assert_eq!(ttft["unit"], "ms", "{ttft}");
    assert_eq!(num(ttft, &["count"]), 12.0, "{ttft}");
    let p90 = num(ttft, &["p90"]);
    // The bucket the observations fall in, in ms (a 20 ms TTFT observed at 20.0x ms).
    assert!((20.0..=40.0).contains(&p90), "server TTFT p90 {p90} ms");
    // The sum is in ms too: 12 observations of about 20 ms (never 12 × 0.02).
    let sum = num(ttft, &["sum"]);
    assert!((12.0 * 20.0..=12.0 * 40.0).contains(&sum), "sum {sum}");

    let goals = report["goals"].as_array().expect("goals");
    assert_eq!(goals.len(), 2, "{goals:?}");
    assert_eq!(goals[0]["failed"], true, "{}", goals[0]);
    assert_eq!(num(&goals[0], &["value"]), p90, "{}", goals[0]);
    assert_eq!(goals[1]["failed"], false, "{}", goals[1]);

    // The terminal's row shows the same number, in ms.
    let row = out
        .stdout
        .lines()
        .find(|line| line.contains("TTFT p90 (ms)") && line.contains("time_to_first_token"))
        .unwrap_or_else(|| panic!("no server TTFT p90 row:\n{}", out.stdout));
    assert!(
        row.contains(&format!("{p90:.2}")),
        "{row} (goal read {p90})"
    );
}
