//! The coordinator library turns a run into a report and a verdict with no CLI in between
//! (`coordinator::RunPlan`): the entry point the capacity search builds on. Each test
//! builds a typed `RunConfig` in code (no argv), prepares and executes it in this process
//! against a real mock server, with workers over loopback gRPC: in-process ones
//! (`worker::InProcess`) dialling a listener the test owns, or worker processes (the
//! `llm-replay` binary, the CLI's default launcher). Errors and verdicts are matched as
//! variants, not messages.

use std::sync::Arc;
use std::time::Duration;

use common::launch::WorkerLauncher;
use coordinator::ProcessLauncher;
use coordinator::RunConfig;
use coordinator::RunSnapshot;
use coordinator::{InputAt, RunError};
use coordinator::{RunHooks, RunOutcome, RunPlan, Verdict};
use fixtures::{MockServer, TempDir, bin, parallel_lock, write_chat_recording};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Prepare and execute `config` with no interrupt, the live snapshots kept, workers started
/// by `launcher` and, when `own_listener`, a worker-link listener bound here and handed over:
/// the outcome and the last snapshot published.
fn run(
    config: RunConfig,
    launcher: Arc<dyn WorkerLauncher>,
    own_listener: bool,
) -> (RunOutcome, RunSnapshot) {
    runtime().block_on(async {
        let plan = RunPlan::prepare(config).await.expect("a valid plan");
        let listener = match own_listener {
            true => Some(
                tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("a loopback listener"),
            ),
            false => None,
        };
        let (_interrupt_tx, interrupt) = tokio::sync::watch::channel(false);
        let (snapshots, last) = tokio::sync::watch::channel(RunSnapshot::default());
        let outcome = plan
            .execute(RunHooks {
                interrupt,
                snapshots: Some(snapshots),
                waiting_for_workers: &|_, _| {},
                launcher,
                listener,
                requests_out: None,
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
fn a_typed_config_replays_through_in_process_workers_on_a_listener_the_caller_owns() {
    let _cores = parallel_lock();
    let mock = MockServer::start(&["--ttft", "20ms", "--itl", "2ms", "--tokens", "5"]);
    let dir = TempDir::new("library-in-process");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 12, 5, None);
    let config = RunConfig::builder(&recording)
        .target(&mock.url)
        .concurrency(4)
        .requests(24)
        .workers(2)
        .timeout(Duration::from_secs(10))
        .fail_if("llm.ttft-p50 > 5000")
        .build()
        .expect("a valid configuration");
    let (outcome, last) = run(config, Arc::new(worker::InProcess), true);
    assert_eq!(outcome.verdict, Verdict::Passed);
    let report = serde_json::to_value(&outcome.report).expect("the report serializes");
    assert_eq!(num(&report, &["requests", "succeeded"]), 24.0, "{report:#}");
    let ttft = num(&report, &["llm", "ttft_ms", "p50"]);
    assert!((19.0..60.0).contains(&ttft), "TTFT p50 {ttft} ms");
    // Both in-process workers joined and answered for their part.
    let workers = report["run"]["workers"].as_array().expect("workers");
    assert_eq!(workers.len(), 2, "{report:#}");
    assert!(last.finished);
    assert_eq!(last.answered, 24);
}

#[test]
fn a_sweep_becomes_a_report_with_its_levels_and_a_goal_verdict() {
    let _cores = parallel_lock();
    let mock = MockServer::start(&["--ttft", "20ms", "--itl", "2ms", "--tokens", "5"]);
    let dir = TempDir::new("library-sweep");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 24, 5, None);
    let mut config = RunConfig::builder(&recording)
        .target(&mock.url)
        .requests(24)
        // Holds: TTFT is about 20 ms, not over 5 s.
        .fail_if("llm.ttft-p50 > 5000")
        // Fails: every TTFT is over a microsecond.
        .fail_if("llm.ttft-p50 > 0.001")
        .build()
        .expect("a valid configuration");
    config.sweep = vec![1, 4];
    // Worker processes: the CLI's launcher.
    let launcher = Arc::new(ProcessLauncher::new(bin("llm-replay")));
    let (outcome, last) = run(config, launcher, false);
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
    let goals = report["goals"].as_array().expect("goals");
    assert_eq!(goals.len(), 2);
    assert_eq!(goals[0]["failed"], false, "{goals:#?}");
    assert_eq!(goals[1]["failed"], true, "{goals:#?}");
    // The live view's last word is the last level's final numbers.
    assert!(last.finished);
    assert_eq!(last.answered, 24);
}

#[test]
fn a_run_that_reaches_nothing_is_an_unreachable_verdict_with_its_report() {
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
    let config = RunConfig::builder(&recording)
        .target(&target)
        .build()
        .expect("valid");
    let (outcome, _) = run(config, Arc::new(worker::InProcess), true);
    assert!(
        matches!(&outcome.verdict, Verdict::RunFailed(RunError::Unreachable { target: t, .. }) if *t == target),
        "{:?}",
        outcome.verdict
    );
    let report = serde_json::to_value(&outcome.report).expect("the report serializes");
    assert_eq!(num(&report, &["requests", "failed"]), 3.0, "{report:#}");
}

#[test]
fn bad_input_is_found_before_any_load_and_names_where_it_is() {
    let prepare = |config: RunConfig| runtime().block_on(RunPlan::prepare(config));
    let dir = TempDir::new("library-input");
    let empty = dir.join("empty.jsonl");
    std::fs::write(&empty, "").expect("write");
    match prepare(RunConfig::builder(&empty).build().expect("valid")) {
        Err(RunError::Input {
            at: InputAt::File { path, .. },
            message,
        }) => {
            assert_eq!(path, empty);
            assert!(message.contains("no exchanges"), "{message}");
        }
        other => panic!("{:?}", other.err()),
    }
    // A bad line: its file and line number.
    let torn = dir.join("torn.jsonl");
    std::fs::write(&torn, "{\"not\": \"an exchange\"}\n").expect("write");
    match prepare(RunConfig::builder(&torn).build().expect("valid")) {
        Err(RunError::Input {
            at: InputAt::File { path, line, .. },
            ..
        }) => {
            assert_eq!(path, torn);
            assert_eq!(line, Some(1));
        }
        other => panic!("{:?}", other.err()),
    }
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 2, 5, None);
    let config = RunConfig::builder(&recording)
        .fail_if("llm.nonsense > 1")
        .build()
        .expect("goals are read by prepare");
    match prepare(config) {
        Err(RunError::Input {
            at: InputAt::Option(option),
            message,
        }) => {
            assert_eq!(option, "goal");
            assert!(message.contains("nonsense"), "{message}");
        }
        other => panic!("{:?}", other.err()),
    }
    // The builder's own checks name the option.
    for (built, option) in [
        (
            RunConfig::builder(&recording).workers(0).build(),
            "--workers",
        ),
        (
            RunConfig::builder(&recording).target("ftp://x").build(),
            "--target",
        ),
        (
            RunConfig::builder(&recording)
                .timeout(Duration::ZERO)
                .build(),
            "--timeout",
        ),
    ] {
        match built {
            Err(RunError::Input {
                at: InputAt::Option(named),
                ..
            }) => assert_eq!(named, option),
            other => panic!("{option}: {other:?}"),
        }
    }
}
