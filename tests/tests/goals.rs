//! Acceptance: goal exit codes and bad input. `--fail-if` that holds exits 1, one that does
//! not exits 0, an unknown metric exits 2 listing the valid names, and a malformed recording
//! line exits 2 naming the file and the line.

use fixtures::{MockServer, TempDir, llm_replay, parallel_lock, write_chat_recording};

fn quick_run(extra: &[&str]) -> fixtures::RunOutput {
    let mock = MockServer::start(&["--ttft", "3ms", "--itl", "1ms", "--tokens", "5"]);
    let dir = TempDir::new("goals");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 10, 5, None);
    let mut args = vec![
        "run",
        recording.to_str().expect("utf-8 path"),
        "--target",
        &mock.url,
        "--concurrency",
        "2",
    ];
    args.extend_from_slice(extra);
    llm_replay(&args, None)
}

#[test]
fn goal_that_holds_fails_the_run() {
    let _parallel = parallel_lock();
    let out = quick_run(&["--fail-if", "llm.ttft-p95 > 1"]);
    assert_eq!(
        out.code, 1,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    assert!(out.stdout.contains("FAIL"), "{}", out.stdout);
}

#[test]
fn goal_that_does_not_hold_passes() {
    let _parallel = parallel_lock();
    // `--fail-if` fails the run when its condition holds (the contract's
    // `--fail-if 'llm.ttft-p95 > 800'`); a TTFT of a few ms is not above 100 s.
    let out = quick_run(&["--fail-if", "llm.ttft-p95 > 100000"]);
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    assert!(out.stdout.contains("PASS"), "{}", out.stdout);
}

#[test]
fn unknown_metric_is_a_usage_error_listing_names() {
    let _parallel = parallel_lock();
    let out = quick_run(&["--fail-if", "llm.nope > 1"]);
    assert_eq!(out.code, 2, "stderr:\n{}", out.stderr);
    assert!(out.stderr.contains("llm.nope"), "{}", out.stderr);
    assert!(
        out.stderr.contains("llm.ttft-p95"),
        "valid names are listed: {}",
        out.stderr
    );
}

#[test]
fn malformed_recording_line_names_file_and_line() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("badline");
    let recording = dir.join("broken.jsonl");
    write_chat_recording(&recording, 5, 5, None);
    let text = std::fs::read_to_string(&recording).expect("read");
    let mut lines: Vec<&str> = text.lines().collect();
    lines[2] = r#"{"request":{"path":"/v1/chat/completions","body":{"not":"a string"}}}"#;
    std::fs::write(&recording, lines.join("\n") + "\n").expect("write");
    let out = llm_replay(
        &[
            "run",
            recording.to_str().expect("utf-8 path"),
            "--target",
            "http://127.0.0.1:9",
        ],
        None,
    );
    assert_eq!(out.code, 2, "stderr:\n{}", out.stderr);
    assert!(out.stderr.contains("broken.jsonl:3"), "{}", out.stderr);
    assert!(out.stderr.contains("request.body"), "{}", out.stderr);
}

#[test]
fn goals_from_a_config_file() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("config");
    let config = dir.join("goals.yaml");
    std::fs::write(&config, "goals:\n  - 'llm.ttft-p50 > 1'\n").expect("write config");
    let out = quick_run(&["--config", config.to_str().expect("utf-8 path")]);
    assert_eq!(
        out.code, 1,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
}
