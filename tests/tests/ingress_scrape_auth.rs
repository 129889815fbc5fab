//! A `--server-metrics` endpoint that needs credentials and redirects (issue 33, item 4):
//! LiteLLM's `/metrics` wants its key, then answers `307 → /metrics/`. With
//! `--server-metrics-header 'Authorization: Bearer ${VAR}'` it is scraped; the header never
//! follows a redirect to another origin; without it, the note names the fix. Against a real
//! `llm-replay mock` target and a real HTTP gate (`fixtures::metrics_gate`) on loopback.

use std::path::Path;
use std::process::{Command, Stdio};

use fixtures::metrics_gate::{GateConfig, MetricsGate};
use fixtures::{MockServer, TempDir, bin, num, parallel_lock, write_chat_recording};

/// The bearer the gate demands, given to the run through the environment only.
const KEY: &str = "Bearer gate-s3cret";

/// `llm-replay ARGS...` with `env` added, its exit code, stdout and JSON report.
fn run_with_env(
    args: &[&str],
    env: &[(&str, &str)],
    report: &Path,
) -> (i32, String, Option<serde_json::Value>) {
    let output = Command::new(bin("llm-replay"))
        .args(args)
        .arg("--report-json")
        .arg(report)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("llm-replay runs");
    let json = std::fs::read_to_string(report)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text, json)
}

/// A short run against `mock` scraping `metrics_url` every 100 ms, with `extra` flags.
fn scrape_run(
    dir: &TempDir,
    name: &str,
    mock: &MockServer,
    metrics_url: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (i32, String, serde_json::Value) {
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 12, 20, None);
    let mut args = vec![
        "run",
        rec.to_str().expect("utf-8 path"),
        "--target",
        &mock.url,
        "--schedule",
        "asap",
        "--concurrency",
        "2",
        "--server-metrics-interval",
        "100ms",
        "--server-metrics",
        metrics_url,
    ];
    args.extend_from_slice(extra);
    let (code, text, report) = run_with_env(&args, env, &dir.join(name));
    let report = report.unwrap_or_else(|| panic!("no report: exit {code}\n{text}"));
    (code, text, report)
}

/// The endpoint needs `Authorization: Bearer …` on every request and answers `/metrics` with
/// `307 → /metrics/` (same origin): with `--server-metrics-header` expanded from `${GATE_KEY}`
/// it is scraped every round with no error, every request carried the key, and its counter
/// is in the report (delta ≥ 3 over a run of about a second scraped every 100 ms). Without
/// the header, the note names HTTP 401 and `--server-metrics-header`.
#[test]
fn a_bearer_endpoint_that_redirects_within_its_origin_is_scraped() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "10ms", "--tokens", "20"]);
    let gate = MetricsGate::start(GateConfig {
        bearer: Some(KEY.to_owned()),
        redirects: vec![("/metrics".to_owned(), "/metrics/".to_owned())],
        metrics_path: "/metrics/".to_owned(),
        ..GateConfig::default()
    });
    let dir = TempDir::new("scrape-auth");
    let url = format!("{}/metrics", gate.origin);
    let (code, text, report) = scrape_run(
        &dir,
        "with.json",
        &mock,
        &url,
        &[
            "--server-metrics-header",
            "Authorization: Bearer ${GATE_KEY}",
        ],
        &[("GATE_KEY", "gate-s3cret")],
    );
    assert_eq!(code, 0, "{text}");
    let endpoint = &report["server"]["endpoints"][1];
    assert!(
        endpoint["url"]
            .as_str()
            .is_some_and(|u| u.ends_with("/metrics")),
        "{endpoint}"
    );
    assert!(endpoint.get("note").is_none(), "{endpoint}");
    assert_eq!(num(endpoint, &["errors"]), 0.0, "{endpoint}");
    assert!(num(endpoint, &["scrapes"]) >= 3.0, "{endpoint}");
    let delta = num(
        &report["server"]["metrics"]["gate_scrapes_total"],
        &["delta"],
    );
    assert!(delta >= 3.0, "{:#}", report["server"]);
    let seen = gate.seen();
    assert!(
        seen.iter().all(|r| r.authorization.as_deref() == Some(KEY)),
        "{seen:?}"
    );
    let redirected = seen.iter().filter(|r| r.status == 307).count();
    let answered = seen
        .iter()
        .filter(|r| r.path == "/metrics/" && r.status == 200)
        .count();
    assert!(redirected >= 3 && answered == redirected, "{seen:?}");
    // The key never appears in the report or on the terminal.
    assert!(!report.to_string().contains("gate-s3cret"));
    assert!(!text.contains("gate-s3cret"), "{text}");

    // Without the header: a note naming the status and the fix; the run is unaffected.
    let (code, text, report) = scrape_run(&dir, "without.json", &mock, &url, &[], &[]);
    assert_eq!(code, 0, "{text}");
    let note = report["server"]["endpoints"][1]["note"]
        .as_str()
        .unwrap_or_else(|| panic!("no note: {:#}", report["server"]))
        .to_owned();
    assert!(note.contains("HTTP 401"), "{note}");
    assert!(note.contains("--server-metrics-header"), "{note}");
}

/// A redirect to another origin is not followed, so the key never reaches it: the other
/// origin receives no request at all, and the note names the Location and
/// `--server-metrics`. A `${VAR}` not set in the coordinator's environment is a usage error
/// (exit 2) naming the variable, before any load.
#[test]
fn the_header_never_crosses_to_another_origin_and_an_unset_variable_is_refused() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "10ms", "--tokens", "20"]);
    let elsewhere = MetricsGate::start(GateConfig::default());
    let location = format!("{}/metrics", elsewhere.origin);
    let gate = MetricsGate::start(GateConfig {
        bearer: Some(KEY.to_owned()),
        redirects: vec![("/metrics".to_owned(), location.clone())],
        ..GateConfig::default()
    });
    let dir = TempDir::new("scrape-auth-cross");
    let url = format!("{}/metrics", gate.origin);
    let header = [
        "--server-metrics-header",
        "Authorization: Bearer ${GATE_KEY}",
    ];
    let (code, text, report) = scrape_run(
        &dir,
        "cross.json",
        &mock,
        &url,
        &header,
        &[("GATE_KEY", "gate-s3cret")],
    );
    assert_eq!(code, 0, "{text}");
    assert!(elsewhere.seen().is_empty(), "{:?}", elsewhere.seen());
    let note = report["server"]["endpoints"][1]["note"]
        .as_str()
        .unwrap_or_else(|| panic!("no note: {:#}", report["server"]))
        .to_owned();
    assert!(note.contains("HTTP 307"), "{note}");
    assert!(note.contains(&location), "{note}");
    assert!(note.contains("--server-metrics"), "{note}");

    let rec = dir.join("rec.jsonl");
    let (code, text, _) = run_with_env(
        &[
            "run",
            rec.to_str().expect("utf-8 path"),
            "--target",
            &mock.url,
            "--server-metrics",
            &url,
            "--server-metrics-header",
            "Authorization: Bearer ${GATE_KEY_NOT_SET}",
        ],
        &[],
        &dir.join("unset.json"),
    );
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("${GATE_KEY_NOT_SET} is not set"), "{text}");
}
