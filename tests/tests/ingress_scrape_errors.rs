//! What a scrape that fails mid-run, a gateway relaying a different replica each scrape, and
//! a path-prefixed target give (issue 33, items 3 and 5), against a real `llm-replay mock`
//! target and a real HTTP gate (`fixtures::metrics_gate`) on loopback.

use fixtures::metrics_gate::{GateConfig, MetricsGate};
use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, write_chat_recording};

/// A run of 12 requests of 20 tokens at 10 ms each, 2 at a time (about 1.2 s), scraping
/// `metrics_url` every 100 ms; its report.
fn scrape_run(dir: &TempDir, mock: &MockServer, metrics_url: &str) -> serde_json::Value {
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 12, 20, None);
    let out = llm_replay(
        &[
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
        ],
        Some(&dir.join("report.json")),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    out.report.expect("a report")
}

/// The endpoint answers its 2nd and 3rd scrapes `502 Bad Gateway` (well inside the run:
/// 100 and 200 ms after the probe, of a run of about 1.2 s): both are counted in
/// `server.endpoints[].errors` (it used to show 0), exactly as many as the gate answered
/// 502, and the endpoint is still scraped after them.
#[test]
fn scrapes_answered_502_during_the_run_are_counted_as_errors() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "10ms", "--tokens", "20"]);
    let gate = MetricsGate::start(GateConfig {
        bad_gateway: 2..=3,
        ..GateConfig::default()
    });
    let dir = TempDir::new("scrape-502");
    let report = scrape_run(&dir, &mock, &format!("{}/metrics", gate.origin));
    let endpoint = &report["server"]["endpoints"][1];
    let answered_502 = gate.seen().iter().filter(|r| r.status == 502).count();
    assert_eq!(answered_502, 2, "{:?}", gate.seen());
    assert_eq!(num(endpoint, &["errors"]), 2.0, "{endpoint}");
    assert!(num(endpoint, &["scrapes"]) >= 4.0, "{endpoint}");
    assert!(endpoint.get("note").is_none(), "{endpoint}");
}

/// A gateway whose `/metrics` relays pod `a`, then `b`, then `a`… (its counter still grows,
/// so no counter steps back): the replica label changing marks the endpoint mixed, and its
/// counter is left out of `server.metrics`, never stated as one server's rate.
#[test]
fn a_replica_label_changing_between_scrapes_is_named_mixed() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "10ms", "--tokens", "20"]);
    let gate = MetricsGate::start(GateConfig {
        replicas: vec!["a".to_owned(), "b".to_owned()],
        ..GateConfig::default()
    });
    let dir = TempDir::new("scrape-replicas");
    let report = scrape_run(&dir, &mock, &format!("{}/metrics", gate.origin));
    let server = &report["server"];
    let mixed = server["endpoints"][1]["mixed"]
        .as_str()
        .unwrap_or_else(|| panic!("not named mixed: {server:#}"));
    assert!(mixed.contains("replica its labels name changed"), "{mixed}");
    assert!(
        mixed.contains("pod=\"a\"") && mixed.contains("pod=\"b\""),
        "{mixed}"
    );
    assert!(
        server["metrics"].get("gate_scrapes_total").is_none(),
        "{server:#}"
    );
    // The target's own /metrics (one mock) is not mixed and still reported.
    assert!(server["endpoints"][0].get("mixed").is_none(), "{server:#}");
    assert!(
        server["metrics"]
            .get("vllm:generation_tokens_total")
            .is_some()
    );
}

/// A target behind a path prefix (`http://HOST/team/v1`) whose origin has no `/metrics`: the
/// note suggests `--server-metrics http://HOST/team/metrics`.
#[test]
fn a_path_prefixed_target_gets_a_hint_to_try_its_prefix_metrics() {
    let _parallel = parallel_lock();
    let gate = MetricsGate::start(GateConfig {
        metrics_path: "/team/metrics".to_owned(),
        ..GateConfig::default()
    });
    let dir = TempDir::new("scrape-prefix");
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 2, 5, None);
    let target = format!("{}/team/v1", gate.origin);
    let out = llm_replay(
        &[
            "run",
            rec.to_str().expect("utf-8 path"),
            "--target",
            &target,
        ],
        Some(&dir.join("report.json")),
    );
    let report = out
        .report
        .unwrap_or_else(|| panic!("no report: exit {}\n{}", out.code, out.stderr));
    let note = report["server"]["endpoints"][0]["note"]
        .as_str()
        .unwrap_or_else(|| panic!("no note: {:#}", report["server"]))
        .to_owned();
    assert!(note.contains("HTTP 404"), "{note}");
    let hint = format!("try --server-metrics {}/team/metrics", gate.origin);
    assert!(note.contains(&hint), "{note}");
}
