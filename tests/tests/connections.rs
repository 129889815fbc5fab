//! Nothing the client can do ahead is measured as the server's: the first wave's connections
//! are opened before the start and timed apart (`llm.connect_ms`, `llm.tls_handshake_ms`),
//! and a recorded schedule is kept to a fraction of a millisecond (the pacer thread, not
//! tokio's millisecond timer).

use std::path::Path;

use fixtures::{MockServer, TempDir, llm_replay, num, write_chat_recording};

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The mock's TTFT in the first-wave test, ms.
const MOCK_TTFT_MS: f64 = 200.0;

/// How far the first wave's TTFT p99 may sit above the mock's: 128 streams start at one
/// instant on a shared 2-core machine (worker and mock both scheduling 128 tasks). Before the
/// connections were opened ahead, the first wave paid their setup: +32.7 ms at p99.
const FIRST_WAVE_TTFT_P99_TOLERANCE_MS: f64 = 10.0;

/// Acceptance ("Fidelity and speed at scale"): at concurrency 128 with no warm-up, the first
/// wave is measured like the rest. The 128 connections it needs are opened before the start,
/// each one timed in `llm.connect_ms`, none of them inside a TTFT.
#[test]
fn first_wave_pays_no_connection_setup_in_ttft() {
    let _timing = fixtures::timing_lock();
    fixtures::remeasure("first wave at c=128", measure_first_wave);
}

/// One run of the first wave: `Err` with the numbers when a TTFT is outside its tolerance.
fn measure_first_wave() -> Result<(), String> {
    let mock = MockServer::start(&["--ttft", "200ms", "--itl", "10ms", "--tokens", "10"]);
    let dir = TempDir::new("first-wave");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 128, 10, None);
    let report_path = dir.join("report.json");
    let md_path = dir.join("report.md");
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--concurrency",
            "128",
            "--requests",
            "128",
            "--report-md",
            path_str(&md_path),
        ],
        Some(&report_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report JSON");
    assert_eq!(
        num(&report, &["requests", "succeeded"]),
        128.0,
        "{report:#}"
    );
    assert_eq!(num(&report, &["requests", "warmup"]), 0.0, "{report:#}");
    // One connection per concurrency slot, each timed once.
    assert_eq!(
        num(&report, &["llm", "connect_ms", "count"]),
        128.0,
        "{:#}",
        report["llm"]
    );
    assert!(num(&report, &["llm", "connect_ms", "max"]) > 0.0);
    assert!(
        report["llm"]["tls_handshake_ms"].is_null(),
        "no TLS on a cleartext target: {:#}",
        report["llm"]
    );
    let p50 = num(&report, &["llm", "ttft_ms", "p50"]);
    let p99 = num(&report, &["llm", "ttft_ms", "p99"]);
    eprintln!(
        "first wave at c=128, no warm-up: TTFT p50 {p50:.3} ms, p99 {p99:.3} ms; connect p99 {:.3} ms",
        num(&report, &["llm", "connect_ms", "p99"])
    );
    assert!(
        p50 >= MOCK_TTFT_MS - 1.0,
        "TTFT p50 {p50} ms: earlier than the server"
    );
    // The renderers show it too.
    assert!(
        out.stdout.contains("Connection setup (ms)"),
        "{}",
        out.stdout
    );
    let md = std::fs::read_to_string(&md_path).expect("Markdown report");
    assert!(md.contains("| Connection setup (ms) |"), "{md}");
    if p99 - MOCK_TTFT_MS <= FIRST_WAVE_TTFT_P99_TOLERANCE_MS {
        Ok(())
    } else {
        Err(format!(
            "TTFT p99 {p99} ms is more than {FIRST_WAVE_TTFT_P99_TOLERANCE_MS} ms above {MOCK_TTFT_MS} ms"
        ))
    }
}

/// Keep-alive: a connection that carried a stream carries the next request, even when the
/// stream's terminal frame (`[DONE]`) is read before the end of its chunked body (the rest is
/// read after the outcome is measured). Four slots, forty requests: four connections, each
/// timed once, and no request resent.
#[test]
fn streams_reuse_their_connections() {
    let _shared = fixtures::parallel_lock();
    let mock = MockServer::start(&["--ttft", "2ms", "--itl", "1ms", "--tokens", "5"]);
    let dir = TempDir::new("keep-alive");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 40, 5, None);
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--concurrency",
            "4",
            "--requests",
            "40",
            "--warmup",
            "0",
        ],
        Some(&report_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report JSON");
    assert_eq!(num(&report, &["requests", "succeeded"]), 40.0, "{report:#}");
    assert_eq!(
        num(&report, &["llm", "connect_ms", "count"]),
        4.0,
        "one connection per slot: {:#}",
        report["llm"]
    );
    assert_eq!(num(&report, &["requests", "resent"]), 0.0, "{report:#}");
}

/// Acceptance: on a recorded schedule with 5 ms gaps, requests go out within 0.2 ms of their
/// intended time at the median (tokio's timer alone rounds every wait up to the next
/// millisecond: 0.99 ms at p50, 1.54 ms at p99 before the pacer). 200 requests (a 1 s
/// schedule; 400 took 2.6 s): the median of 200 lags is as sure a reading of 0.2 ms against
/// 0.99 as of 400.
#[test]
fn recorded_schedule_with_5ms_gaps_keeps_sub_millisecond_lag() {
    let _timing = fixtures::timing_lock();
    fixtures::remeasure("recorded schedule, 5 ms gaps", measure_schedule_lag);
}

/// One run on the 5 ms schedule: `Err` with the numbers when the lag is outside its tolerance.
fn measure_schedule_lag() -> Result<(), String> {
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "1ms", "--tokens", "5"]);
    let dir = TempDir::new("lag-5ms");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 200, 5, Some(5.0));
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &["run", path_str(&recording), "--target", &mock.url],
        Some(&report_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report JSON");
    assert_eq!(
        num(&report, &["requests", "succeeded"]),
        200.0,
        "{report:#}"
    );
    assert_eq!(num(&report, &["llm", "schedule_lag_ms", "count"]), 200.0);
    let p50 = num(&report, &["llm", "schedule_lag_ms", "p50"]);
    let p99 = num(&report, &["llm", "schedule_lag_ms", "p99"]);
    eprintln!("recorded schedule, 5 ms gaps: schedule lag p50 {p50:.3} ms, p99 {p99:.3} ms");
    // The p99 goal (≤ 1 ms) is the benchmark's (`bench/run.py --rows lag`,
    // docs/performance.md), on a quiet machine with the server and the client on a core
    // each; here everything shares two cores with the test harness, and p99 read 3.9 ms at a
    // load average of 7 (other builds running).
    if p50 <= 0.2 {
        Ok(())
    } else {
        Err(format!("schedule lag p50 {p50} ms (≤ 0.2), p99 {p99} ms"))
    }
}

/// On a recorded schedule the slice is read ahead while the start is awaited, so the first
/// exchanges go out on time however large the read-ahead window: 4,500 exchanges 0.5 ms
/// apart fill the default window of 4,096, whose requests were once built at the start
/// instead (the first twenty went out 13-22 ms late, catching up one gap at a time). The
/// first wave's connections are then sized from what was read ahead: 256 (the estimate's
/// cap) for a first second of 2,000 exchanges, where it used to be one. (5,000 exchanges 1 ms
/// apart took 5.7 s for the same assertions; 2.3 s of schedule now.)
#[test]
fn a_full_read_ahead_window_does_not_delay_the_first_exchanges() {
    let _timing = fixtures::timing_lock();
    fixtures::remeasure(
        "the first exchanges of a 4,500-exchange schedule",
        measure_first_exchanges,
    );
}

/// One run of the 4,500-exchange schedule: `Err` when the first twenty exchanges' median
/// schedule lag is 5 ms or more (0.05-1.5 ms here; 18-38 ms before the read-ahead).
fn measure_first_exchanges() -> Result<(), String> {
    // More than the read-ahead window of 4,096.
    const EXCHANGES: usize = 4500;
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "1ms", "--tokens", "3"]);
    let dir = TempDir::new("read-ahead");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, EXCHANGES, 3, Some(0.5));
    let records = dir.join("requests.jsonl");
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--requests-out",
            path_str(&records),
        ],
        Some(&report_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report JSON");
    assert_eq!(
        num(&report, &["requests", "succeeded"]),
        EXCHANGES as f64,
        "{report:#}"
    );
    assert!(
        num(&report, &["llm", "connect_ms", "count"]) >= 256.0,
        "the first wave's connections open before the start: {:#}",
        report["llm"]["connect_ms"]
    );
    let mut lines: Vec<serde_json::Value> = std::fs::read_to_string(&records)
        .expect("requests-out written")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    lines.sort_by_key(|l| l["index"].as_u64().expect("index"));
    let mut first: Vec<f64> = lines[..20]
        .iter()
        .map(|l| l["schedule_lag_ms"].as_f64().expect("lag"))
        .collect();
    first.sort_by(f64::total_cmp);
    let median = first[first.len() / 2];
    eprintln!(
        "first 20 exchanges of {EXCHANGES}: schedule lag median {median:.3} ms, max {:.3} ms",
        first[first.len() - 1]
    );
    if median < 5.0 {
        Ok(())
    } else {
        Err(format!(
            "the first 20 exchanges' median schedule lag is {median} ms (< 5)"
        ))
    }
}
