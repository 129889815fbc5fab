//! A run without goals that hides failures (issue 33, item 17): more than 5 % of requests
//! failed and no goal was set, so the run exits 0 — the report warns, naming the goal that
//! would fail it. Against the real `llm-replay mock` answering 30 % of requests with HTTP 500.

use std::path::Path;

use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, write_chat_recording};
use serde_json::Value;

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn failure_warnings(report: &Value) -> Vec<String> {
    report["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter_map(Value::as_str)
        .filter(|w| w.contains("no goal was set"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn failures_above_five_percent_without_a_goal_are_warned() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&[
        "--ttft",
        "2ms",
        "--itl",
        "1ms",
        "--tokens",
        "3",
        "--fail-rate",
        "30%",
        "--seed",
        "7",
    ]);
    let dir = TempDir::new("ingress-failure-share");
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 40, 3, None);
    let run = |extra: &[&str], name: &str| {
        let mut args = vec![
            "run",
            path_str(&rec),
            "--target",
            &mock.url,
            "--schedule",
            "asap",
            "--concurrency",
            "2",
            "--no-server-metrics",
        ];
        args.extend_from_slice(extra);
        llm_replay(&args, Some(&dir.join(name)))
    };

    let out = run(&[], "no-goal.json");
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report = out.report.expect("report");
    let failed = num(&report, &["requests", "failed"]);
    let succeeded = num(&report, &["requests", "succeeded"]);
    // 30 % of 40 drawn: well above 5 %, and some succeeded.
    assert!(failed >= 4.0 && succeeded >= 1.0, "{}", report["requests"]);
    let warnings = failure_warnings(&report);
    assert_eq!(warnings.len(), 1, "{:#}", report["warnings"]);
    assert!(
        warnings[0].contains(&format!("({failed} of 40 that got an outcome)"))
            && warnings[0].contains("--fail-if 'llm.error-rate > 5'"),
        "{}",
        warnings[0]
    );
    assert!(out.stdout.contains("no goal was set"), "{}", out.stdout);

    // With a goal (even one that holds), the goal is the user's choice: no such warning.
    let out = run(&["--fail-if", "llm.ttft-p99 > 100000"], "goal.json");
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report = out.report.expect("report");
    assert!(
        failure_warnings(&report).is_empty(),
        "{:#}",
        report["warnings"]
    );
}
