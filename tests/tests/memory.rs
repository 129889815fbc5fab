//! Acceptance: a replay of 100,000 exchanges keeps worker RSS under 200 MB. The worker reports
//! its own peak RSS (`VmHWM`) in its final report.

use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, write_chat_recording};

#[test]
fn hundred_thousand_exchanges_stay_under_200_mb() {
    // 100,000 requests at concurrency 64 keep both cores busy, but it measures memory, not
    // time: the shared guard keeps it away from timing tests (see `parallel_lock`).
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "0ms", "--itl", "0ms", "--tokens", "2"]);
    let dir = TempDir::new("memory");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 100_000, 2, None);
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &[
            "run",
            recording.to_str().expect("utf-8 path"),
            "--target",
            &mock.url,
            "--concurrency",
            "64",
        ],
        Some(&report_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report JSON");
    assert_eq!(num(&report, &["requests", "total"]), 100_000.0);
    assert_eq!(num(&report, &["requests", "succeeded"]), 100_000.0);
    let workers = report["run"]["workers"].as_array().expect("workers");
    for worker in workers {
        let peak_mb = num(worker, &["peak_rss_mb"]);
        eprintln!("worker peak RSS over 100,000 exchanges: {peak_mb:.1} MB");
        assert!(
            peak_mb > 1.0 && peak_mb < 200.0,
            "worker peak RSS {peak_mb} MB"
        );
    }
}
