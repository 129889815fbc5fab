//! Acceptance: output tokens come from the server's usage when it sends one (estimated share
//! 0 %), and from the content-frame count when it does not (100 %); OSL equals `--tokens`
//! both ways.

use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, write_chat_recording};

fn run_against(usage: &str) -> serde_json::Value {
    let mock = MockServer::start(&[
        "--ttft", "5ms", "--itl", "1ms", "--tokens", "20", "--usage", usage,
    ]);
    let dir = TempDir::new("usage");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 40, 20, None);
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &[
            "run",
            recording.to_str().expect("utf-8 path"),
            "--target",
            &mock.url,
            "--concurrency",
            "8",
        ],
        Some(&report_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    out.report.expect("report JSON")
}

#[test]
fn usage_reported_means_no_estimate() {
    let _parallel = parallel_lock();
    let report = run_against("on");
    assert_eq!(num(&report, &["llm", "estimated_token_share_pct"]), 0.0);
    assert_eq!(num(&report, &["requests", "usage_reported"]), 40.0);
    assert_eq!(num(&report, &["llm", "osl_tokens", "p50"]), 20.0);
    assert_eq!(num(&report, &["llm", "osl_tokens", "min"]), 20.0);
    assert_eq!(num(&report, &["llm", "osl_tokens", "max"]), 20.0);
}

#[test]
fn no_usage_means_every_stream_estimated() {
    let _parallel = parallel_lock();
    let report = run_against("off");
    assert_eq!(num(&report, &["llm", "estimated_token_share_pct"]), 100.0);
    assert_eq!(num(&report, &["requests", "estimated"]), 40.0);
    assert_eq!(num(&report, &["llm", "osl_tokens", "min"]), 20.0);
    assert_eq!(num(&report, &["llm", "osl_tokens", "max"]), 20.0);
}

/// Each worker runs at least one stream, so a concurrency below the worker count would run
/// at the worker count and be reported as less: a sweep level or a concurrency cap below it
/// is refused, naming the option (exit 2), before any worker starts.
#[test]
fn a_concurrency_below_the_worker_count_is_refused() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("streams-per-worker");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 4, 20, None);
    let recording = recording.to_str().expect("utf-8 path");
    let target = "http://127.0.0.1:9";
    for (flags, option) in [
        (
            &["--sweep-concurrency", "1,4", "--workers", "2"][..],
            "--sweep-concurrency level 1 is below the 2 workers",
        ),
        (
            &["--rate", "10", "--concurrency", "1", "--workers", "2"][..],
            "--concurrency 1 is below the 2 workers",
        ),
    ] {
        let out = llm_replay(
            &[&["run", recording, "--target", target][..], flags].concat(),
            None,
        );
        assert_eq!(out.code, 2, "{flags:?}: {}\n{}", out.stdout, out.stderr);
        assert!(out.stderr.contains(option), "{flags:?}: {}", out.stderr);
    }
}
