//! Acceptance: the shipped example replays against the embedded mock with no other argument,
//! exits 0, and shows baseline and replayed TTFT p50 within 5 % of each other.

use fixtures::{TempDir, llm_replay, num, timing_lock, workspace_root};

#[test]
fn example_replays_against_embedded_mock() {
    let _timing = timing_lock();
    let example = workspace_root().join("examples/qwen3-sharegpt.jsonl");
    let dir = TempDir::new("example");
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &["run", example.to_str().expect("utf-8 path")],
        Some(&report_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    assert!(out.stdout.contains("Baseline"), "{}", out.stdout);
    let report = out.report.expect("report JSON");
    let replayed = num(&report, &["llm", "ttft_ms", "p50"]);
    let baseline = num(&report, &["baseline", "llm", "ttft_ms", "p50"]);
    let change = (replayed - baseline).abs() / baseline * 100.0;
    assert!(
        change <= 5.0,
        "baseline {baseline} ms, replayed {replayed} ms ({change:.1} %)"
    );
    assert_eq!(num(&report, &["requests", "failed"]), 0.0);
}
