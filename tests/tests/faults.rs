//! Acceptance: with the mock injecting 10 % mid-stream connection drops and 10 % HTTP 500s
//! over 1,000 requests, every request is accounted for, each count is within ±4 points of its
//! injected rate, and ended-early streams stay out of latency and ITL.

use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, write_chat_recording};

#[test]
fn injected_faults_are_counted_not_hidden() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&[
        "--ttft",
        "2ms",
        "--itl",
        "1ms",
        "--tokens",
        "10",
        "--drop-rate",
        "0.1",
        "--fail-rate",
        "0.1",
        "--seed",
        "7",
    ]);
    let dir = TempDir::new("faults");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 100, 10, None);
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &[
            "run",
            recording.to_str().expect("utf-8 path"),
            "--target",
            &mock.url,
            "--concurrency",
            "32",
            "--requests",
            "1000",
        ],
        Some(&report_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report JSON");
    let total = num(&report, &["requests", "total"]);
    let succeeded = num(&report, &["requests", "succeeded"]);
    let failed = num(&report, &["requests", "failed"]);
    let ended_early = num(&report, &["requests", "ended_early"]);
    let lost = num(&report, &["requests", "lost"]);
    let not_started = num(&report, &["requests", "not_started"]);
    assert_eq!(total, 1000.0);
    assert_eq!(succeeded + failed + ended_early, total, "{report:#}");
    assert_eq!(lost + not_started, 0.0);
    let pct = |n: f64| 100.0 * n / total;
    assert!((pct(failed) - 10.0).abs() <= 4.0, "failed {failed}");
    // Drops are injected on the requests that did not fail with a 500.
    assert!(
        (pct(ended_early) - 9.0).abs() <= 4.0,
        "ended early {ended_early}"
    );
    assert_eq!(
        num(&report, &["requests", "failed_by_kind", "status"]),
        failed
    );
    // Ended-early streams count toward TTFT only.
    assert_eq!(num(&report, &["llm", "latency_ms", "count"]), succeeded);
    assert_eq!(num(&report, &["llm", "itl_ms", "count"]), succeeded);
    assert_eq!(
        num(&report, &["llm", "ttft_ms", "count"]),
        succeeded + ended_early
    );
}
