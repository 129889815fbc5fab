//! The coordinator library turns a run into a report and a verdict with no CLI in between
//! (`coordinator::run::RunPlan`): the entry point the capacity search builds on. Each test
//! drives `prepare` and `execute` in this process against a real mock server, with real
//! local worker processes (the `llm-replay` binary) over loopback gRPC.

use std::path::Path;

use clap::Parser;
use coordinator::config::RunArgs;
use coordinator::outcome::RunError;
use coordinator::run::{RunHooks, RunPlan, Verdict};
use coordinator::supervisor::RunSnapshot;
use fixtures::{MockServer, TempDir, bin, parallel_lock, write_chat_recording};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    run: RunArgs,
}

fn plan(recording: &Path, args: &[&str]) -> Result<RunPlan, RunError> {
    let mut all = vec!["llm-replay", recording.to_str().expect("utf-8 path")];
    all.extend_from_slice(args);
    let args = Cli::try_parse_from(all).expect("the arguments parse").run;
    runtime().block_on(RunPlan::prepare(args))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Execute a plan with no interrupt, the live snapshots kept, and the `llm-replay` binary
/// as the local workers' program: the outcome and the last snapshot published.
fn execute(plan: RunPlan) -> (coordinator::run::RunOutcome, RunSnapshot) {
    runtime().block_on(async {
        let (_interrupt_tx, interrupt) = tokio::sync::watch::channel(false);
        let (snapshots, last) = tokio::sync::watch::channel(RunSnapshot::default());
        let outcome = plan
            .execute(RunHooks {
                interrupt,
                snapshots: Some(snapshots),
                waiting_for_workers: &|_, _| {},
                worker_program: bin("llm-replay"),
                notices: None,
                search_lines: None,
                search_progress: None,
            })
            .await
            .expect("the run measured something");
        let last = last.borrow().clone();
        (outcome, last)
    })
}

fn num(report: &serde_json::Value, path: &[&str]) -> f64 {
    let mut value = report;
    for key in path {
        value = &value[*key];
    }
    value
        .as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number in {report:#}"))
}

#[test]
fn a_sweep_becomes_a_report_with_its_levels_and_a_goal_verdict() {
    let _cores = parallel_lock();
    let mock = MockServer::start(&["--ttft", "20ms", "--itl", "2ms", "--tokens", "5"]);
    let dir = TempDir::new("library-sweep");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 24, 5, None);
    let plan = plan(
        &recording,
        &[
            "--target",
            &mock.url,
            "--sweep-concurrency",
            "1,4",
            "--requests",
            "24",
            // Holds: TTFT is about 20 ms, not over 5 s.
            "--fail-if",
            "llm.ttft-p50 > 5000",
            // Fails: every TTFT is over a microsecond.
            "--fail-if",
            "llm.ttft-p50 > 0.001",
        ],
    )
    .expect("a valid plan");
    assert_eq!(plan.config().sweep, [1, 4]);
    let (outcome, last) = execute(plan);
    assert_eq!(outcome.verdict, Verdict::GoalFailed);
    assert_eq!(outcome.requests_out_failed, None);
    let report = serde_json::to_value(&outcome.report).expect("the report serializes");
    let levels = report["sweep"].as_array().expect("sweep levels");
    assert_eq!(levels.len(), 2, "{report:#}");
    for (level, concurrency) in levels.iter().zip([1.0, 4.0]) {
        assert_eq!(num(level, &["concurrency"]), concurrency);
        assert_eq!(num(level, &["requests", "succeeded"]), 24.0, "{level:#}");
    }
    // The main numbers are the last level's.
    assert_eq!(num(&report, &["requests", "succeeded"]), 24.0);
    let ttft = num(&report, &["llm", "ttft_ms", "p50"]);
    assert!((19.0..60.0).contains(&ttft), "TTFT p50 {ttft} ms");
    let goals = report["goals"].as_array().expect("goals");
    assert_eq!(goals.len(), 2);
    assert_eq!(goals[0]["failed"], false, "{goals:#?}");
    assert_eq!(goals[1]["failed"], true, "{goals:#?}");
    // The live view's last word is the last level's final numbers.
    assert!(last.finished);
    assert_eq!(last.answered, 24);
}

#[test]
fn a_run_that_reaches_nothing_is_a_failed_verdict_with_its_report() {
    let _cores = parallel_lock();
    let dir = TempDir::new("library-unreachable");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 3, 5, None);
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port();
    let target = format!("http://127.0.0.1:{port}");
    let plan = plan(&recording, &["--target", &target, "--concurrency", "1"]).expect("valid");
    let (outcome, _) = execute(plan);
    match &outcome.verdict {
        Verdict::RunFailed(message) => {
            assert!(message.contains("unreachable"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let report = serde_json::to_value(&outcome.report).expect("the report serializes");
    assert_eq!(num(&report, &["requests", "failed"]), 3.0, "{report:#}");
}

#[test]
fn bad_input_is_found_before_any_load() {
    let dir = TempDir::new("library-input");
    let recording = dir.join("empty.jsonl");
    std::fs::write(&recording, "").expect("write");
    match plan(&recording, &[]) {
        Err(RunError::Input(message)) => {
            assert!(message.contains("no exchanges"), "{message}");
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("an empty recording was accepted"),
    }
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 2, 5, None);
    match plan(&recording, &["--fail-if", "llm.nonsense > 1"]) {
        Err(RunError::Input(message)) => assert!(message.contains("nonsense"), "{message}"),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("an unknown goal metric was accepted"),
    }
}
