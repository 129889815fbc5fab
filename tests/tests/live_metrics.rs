//! `run --metrics-listen`: Prometheus text scraped over a real socket while a real run goes;
//! the histograms and counters grow, and the final scrape agrees with the JSON report.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use fixtures::{MockServer, Spawned, TempDir, bin, num, write_chat_recording};

fn path_str(path: &std::path::Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// GET http://ADDR/metrics with a plain HTTP/1.0 request; `None` when nothing listens.
fn scrape(addr: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4")
    );
    Some(body.to_owned())
}

/// The value of the sample whose name and labels contain every part of `parts`.
fn sample(text: &str, name: &str, parts: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.split(['{', ' '])
                .next()
                .is_some_and(|sample_name| sample_name == name)
        })
        .find(|l| parts.iter().all(|p| l.contains(p)))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} {parts:?} in\n{text}"))
}

/// The run's requests.
const REQUESTS: usize = 80;

#[test]
fn a_scrape_during_the_run_grows_and_the_final_one_matches_the_report() {
    let _parallel = fixtures::parallel_lock();
    let mock = MockServer::start(&["--ttft", "20ms", "--itl", "10ms", "--tokens", "20"]);
    let dir = TempDir::new("live-metrics");
    let recording = dir.join("rec.jsonl");
    // 80 streams of 0.2 s at concurrency 4: a 4 s run, eight report intervals (0.5 s) in
    // which to see the numbers grow (120 streams and a 4 s linger made this test 11 s).
    write_chat_recording(&recording, REQUESTS, 20, None);
    let report_path = dir.join("report.json");
    let mut run = Spawned::start(
        &bin("llm-replay"),
        &[
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--concurrency",
            "4",
            "--workers",
            "2",
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-linger",
            "2s",
            "--report-json",
            path_str(&report_path),
        ],
        &[],
    );
    // The address it bound is on stderr.
    let mut addr = None;
    assert!(
        fixtures::eventually(Duration::from_secs(30), || {
            addr = run.stderr().lines().find_map(|l| {
                let rest = l.split("live metrics on http://").nth(1)?;
                Some(rest.trim_end_matches("/metrics").to_owned())
            });
            addr.is_some()
        }),
        "no live-metrics line on stderr: {}",
        run.stderr()
    );
    let addr = addr.expect("found above");

    // Scrape every 200 ms until the run says its numbers are final.
    let mut succeeded_seen: Vec<f64> = Vec::new();
    let mut ttft_counts: Vec<f64> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let last = loop {
        assert!(Instant::now() < deadline, "the run never finished");
        if let Some(text) = scrape(&addr) {
            let finished = sample(&text, "llm_replay_run_finished", &[]) == 1.0;
            succeeded_seen.push(sample(
                &text,
                "llm_replay_requests_total",
                &["outcome=\"succeeded\""],
            ));
            ttft_counts.push(sample(&text, "llm_replay_ttft_seconds_count", &[]));
            if finished {
                break text;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        run.wait_timeout(Duration::from_secs(30)),
        Some(0),
        "{}",
        run.stderr()
    );

    // Growing: never down, and seen at three or more different values on the way.
    assert!(
        succeeded_seen.windows(2).all(|w| w[0] <= w[1]),
        "{succeeded_seen:?}"
    );
    assert!(
        ttft_counts.windows(2).all(|w| w[0] <= w[1]),
        "{ttft_counts:?}"
    );
    let mut distinct = succeeded_seen.clone();
    distinct.dedup();
    assert!(distinct.len() >= 3, "not seen growing: {succeeded_seen:?}");

    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&report_path).expect("the report was written"),
    )
    .expect("JSON");
    let run_id = report["run"]["id"].as_str().expect("run id");
    assert!(last.contains(&format!("run_id=\"{run_id}\"")), "{last}");
    for (outcome, key) in [
        ("succeeded", "succeeded"),
        ("ended_early", "ended_early"),
        ("lost", "lost"),
        ("not_started", "not_started"),
    ] {
        assert_eq!(
            sample(
                &last,
                "llm_replay_requests_total",
                &[&format!("outcome=\"{outcome}\"")]
            ),
            num(&report, &["requests", key]),
            "{outcome}"
        );
    }
    assert_eq!(num(&report, &["requests", "succeeded"]), REQUESTS as f64);
    for (name, key) in [
        ("llm_replay_ttft_seconds_count", "ttft_ms"),
        ("llm_replay_itl_seconds_count", "itl_ms"),
        ("llm_replay_request_latency_seconds_count", "latency_ms"),
    ] {
        assert_eq!(
            sample(&last, name, &[]),
            num(&report, &["llm", key, "count"]),
            "{name}"
        );
    }
    // The histogram agrees with the report's percentiles: the TTFT p50 (about 20 ms) is
    // under the 50 ms bucket bound and over the 10 ms one, for at least half the requests.
    let under_50ms = sample(&last, "llm_replay_ttft_seconds_bucket", &["le=\"0.05\""]);
    let under_10ms = sample(&last, "llm_replay_ttft_seconds_bucket", &["le=\"0.01\""]);
    assert!(num(&report, &["llm", "ttft_ms", "p50"]) > 10.0);
    assert!(under_50ms >= 60.0 && under_10ms < 60.0, "{last}");
    let tokens = sample(&last, "llm_replay_output_tokens_total", &[]);
    assert!(tokens >= REQUESTS as f64 * 19.0, "output tokens {tokens}");
    assert_eq!(sample(&last, "llm_replay_in_flight_requests", &[]), 0.0);
    assert_eq!(sample(&last, "llm_replay_workers_alive", &[]), 2.0);

    // The example Grafana dashboard asks only for series this endpoint serves.
    let dashboard = std::fs::read_to_string(
        fixtures::workspace_root().join("deploy/grafana/llm-replay-dashboard.json"),
    )
    .expect("the dashboard example exists");
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).expect("JSON");
    let mut asked = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for name in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("llm_replay_"))
            {
                asked += 1;
                assert!(
                    last.lines().any(|l| l.starts_with(name)),
                    "the dashboard asks for {name}, which /metrics does not serve"
                );
            }
        }
    }
    assert!(asked >= 7, "{asked}");
}
