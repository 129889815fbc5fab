//! What a scrape that fails mid-run, a gateway relaying a different replica each scrape, and
//! a path-prefixed target give (issue 33, items 3 and 5), against a real `llm-replay mock`
//! target and a real HTTP gate (`fixtures::metrics_gate`) on loopback.

use fixtures::metrics_gate::{GateConfig, MetricsGate};
use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, write_chat_recording};

/// A run of `requests` requests of 20 tokens at 10 ms each, 2 at a time (0.1 s per request),
/// scraping `metrics_url` every `interval`; its report and stdout.
fn scrape_run(
    dir: &TempDir,
    mock: &MockServer,
    metrics_url: &str,
    requests: usize,
    interval: &str,
) -> (serde_json::Value, String) {
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, requests, 20, None);
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
            interval,
            "--server-metrics",
            metrics_url,
        ],
        Some(&dir.join("report.json")),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    (out.report.expect("a report"), out.stdout)
}

/// The endpoint answers `502 Bad Gateway` from its 3rd scrape on (an upstream killed
/// mid-run), the final scrape after the run included: scraped every 1 s, the 3rd scrape is
/// 2 s after the probe, inside a run of about 4 s (40 requests, 0.2 s each, 2 at a time)
/// whose start takes well under 2 s. Every 502 is counted in `server.endpoints[].errors`
/// (the one after the run's end used to be left out), exactly as many as the gate answered.
#[test]
fn scrapes_answered_502_during_the_run_are_counted_as_errors() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "10ms", "--tokens", "20"]);
    let gate = MetricsGate::start(GateConfig {
        bad_gateway: 3..=1_000,
        ..GateConfig::default()
    });
    let dir = TempDir::new("scrape-502");
    let url = format!("{}/metrics", gate.origin);
    let (report, stdout) = scrape_run(&dir, &mock, &url, 40, "1s");
    let endpoint = &report["server"]["endpoints"][1];
    let answered_502 = gate.seen().iter().filter(|r| r.status == 502).count();
    assert!(answered_502 >= 2, "{:?}", gate.seen());
    assert_eq!(
        num(endpoint, &["errors"]),
        answered_502 as f64,
        "{endpoint}"
    );
    assert!(num(endpoint, &["scrapes"]) >= 1.0, "{endpoint}");
    assert!(endpoint.get("note").is_none(), "{endpoint}");

    // Item 14, on the same run: each server quantile comes with the bucket it lies in, and
    // the Server table never states a negative client − server difference.
    let ttft = &report["server"]["metrics"]["vllm:time_to_first_token_seconds"];
    for (i, stat) in ["p50", "p90", "p99"].into_iter().enumerate() {
        let value = num(ttft, &[stat]);
        let from = num(&ttft["buckets"][i], &["from"]);
        let to = num(&ttft["buckets"][i], &["to"]);
        assert!(
            from <= value && value <= to,
            "{stat} {value} not in {from}–{to}: {ttft}"
        );
    }
    let negative = stdout
        .lines()
        .filter(|line| line.contains("(ms)"))
        .find(|line| {
            line.split_whitespace()
                .last()
                .is_some_and(|last| last.starts_with('-') && last.len() > 1)
        });
    assert_eq!(negative, None, "{stdout}");
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
    let url = format!("{}/metrics", gate.origin);
    let (report, _) = scrape_run(&dir, &mock, &url, 12, "100ms");
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
