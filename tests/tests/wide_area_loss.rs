//! Issue 19 items 3–7: a distributed run whose link to one worker stalls, through the
//! delay/stall proxy (`fixtures::link::DelayLink`) between that worker and the coordinator.
//! Every test is over real sockets with real processes; the stalls are seconds long and the
//! heartbeat timeouts short, so each takes seconds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use fixtures::link::{DelayLink, Direction};
use fixtures::{
    MockServer, TempDir, coordinator, eventually, num, parallel_lock, request_log, worker,
    write_chat_recording,
};

/// A mock whose answers take about 120 ms (20 ms to the first token, 20 tokens 5 ms apart)
/// and that logs every request it gets (`--request-log`), with the exchange it was tagged
/// with when the run says `--tag-requests`.
fn mock(log: &Path) -> MockServer {
    MockServer::start(&[
        "--ttft",
        "20ms",
        "--itl",
        "5ms",
        "--tokens",
        "20",
        "--request-log",
        log.to_str().expect("utf-8 path"),
    ])
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn read_report(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("the report is written"))
        .expect("the report is JSON")
}

/// total = succeeded + failed + ended_early + lost + not_started, and total = `exchanges`.
fn identity_holds(report: &serde_json::Value, exchanges: f64) {
    let r = |k: &str| num(report, &["requests", k]);
    assert_eq!(
        r("total"),
        r("succeeded") + r("failed") + r("ended_early") + r("lost") + r("not_started"),
        "{report:#}"
    );
    assert_eq!(r("total"), exchanges, "every exchange once: {report:#}");
}

/// `run.workers[].disconnected` (absent when false).
fn disconnected(entry: &serde_json::Value) -> bool {
    entry["disconnected"] == true
}

fn worker_entry<'r>(report: &'r serde_json::Value, id: &str) -> &'r serde_json::Value {
    report["run"]["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .find(|w| w["id"] == id)
        .unwrap_or_else(|| panic!("worker {id} is listed: {report:#}"))
}

/// `--requests-out` lines: `(worker, exchange index)` each.
fn request_lines(path: &Path) -> Vec<(String, u64)> {
    std::fs::read_to_string(path)
        .expect("--requests-out is written")
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            (
                v["worker"].as_str().expect("worker").to_owned(),
                v["index"].as_u64().expect("index"),
            )
        })
        .collect()
}

/// The report and `--requests-out` agree: one line per measured request, each exchange at
/// most once, and per worker as many lines as it completed.
fn requests_out_agrees(report: &serde_json::Value, lines: &[(String, u64)]) {
    let r = |k: &str| num(report, &["requests", k]);
    assert_eq!(
        lines.len() as f64,
        r("succeeded") + r("failed") + r("ended_early"),
        "one line per measured request: {report:#}"
    );
    let mut seen = BTreeSet::new();
    let twice: Vec<u64> = lines
        .iter()
        .filter(|(_, index)| !seen.insert(*index))
        .map(|(_, index)| *index)
        .collect();
    assert!(twice.is_empty(), "measured twice: {twice:?}");
    let mut per_worker: BTreeMap<&str, f64> = BTreeMap::new();
    for (worker, _) in lines {
        *per_worker.entry(worker.as_str()).or_default() += 1.0;
    }
    for w in report["run"]["workers"].as_array().expect("workers") {
        let id = w["id"].as_str().expect("id");
        assert_eq!(
            per_worker.get(id).copied().unwrap_or(0.0),
            num(w, &["completed"]),
            "worker {id}: its lines and its completions: {report:#}"
        );
    }
}

/// Move the recording's exchanges from `from` on to ten minutes later: the workers replay
/// the first ones, then wait (their finished requests' tasks not reaped yet).
fn move_tail_ten_minutes_later(recording: &Path, from: usize) {
    let text = std::fs::read_to_string(recording).expect("recording");
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    for (i, line) in lines.iter_mut().enumerate().skip(from) {
        line["at_ms"] = serde_json::json!(600_000.0 + i as f64);
    }
    let rewritten: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(recording, rewritten).expect("rewrite the recording");
}

fn requests_flowed(log: &Path, at_least: usize) -> bool {
    eventually(Duration::from_secs(30), || {
        request_log(log).len() >= at_least
    })
}

/// Item 3: a link that stalls for good (a 40 s stall and more) holds neither the report nor
/// the worker behind it. The coordinator finds the worker silent within its heartbeat
/// timeout, aborts (`fail`), and writes the report without waiting for the stalled stream;
/// the worker finds the coordinator silent within the run's heartbeat timeout and exits.
#[test]
fn a_stalled_link_holds_neither_the_report_nor_the_worker() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("stall-report");
    let log = dir.join("requests.jsonl");
    let mock = mock(&log);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 400, 20, None);
    let report_path = dir.join("report.json");
    let (mut coordinator, addr) = coordinator(
        &[
            path(&recording),
            "--target",
            &mock.url,
            "--concurrency",
            "4",
            "--on-worker-loss",
            "fail",
            "--heartbeat-timeout",
            "2s",
            "--report-json",
            path(&report_path),
        ],
        2,
        &[],
    );
    let link = DelayLink::start(
        &addr,
        Direction::delay(Duration::from_millis(5)),
        Direction::delay(Duration::from_millis(5)),
    );
    let mut near = worker(&addr, "near", &[], &[]);
    let mut far = worker(link.addr(), "far", &[], &[]);
    assert!(requests_flowed(&log, 40), "{}", coordinator.stderr());
    link.set_stalled(true);
    let stalled = Instant::now();
    let code = coordinator.wait_timeout(Duration::from_secs(30));
    let report_after = stalled.elapsed();
    assert_eq!(code, Some(3), "{}", coordinator.stderr());
    eprintln!("report {report_after:?} after the stall began");
    // Lost after 2 s (and a tick), the survivor's final report at once, the server's shutdown
    // bounded: never the stall's length.
    assert!(
        report_after < Duration::from_secs(8),
        "the report came {report_after:?} after the stall began: {}",
        coordinator.stderr()
    );
    let report = read_report(&report_path);
    identity_holds(&report, 400.0);
    assert!(disconnected(worker_entry(&report, "far")), "{report:#}");
    // The worker behind the stall gives up by itself: its heartbeat timeout (the run's, 2 s)
    // and HTTP/2 keepalive on its side do not wait for the stall to end.
    let far_code = far.wait_timeout(Duration::from_secs(10).saturating_sub(stalled.elapsed()));
    let far_after = stalled.elapsed();
    eprintln!("the stalled worker exited {far_after:?} after the stall began");
    assert!(
        matches!(far_code, Some(code) if code != 0),
        "the stalled worker did not give up within 10 s: {far_code:?}\n{}",
        far.stderr()
    );
    assert!(
        far.stderr().contains("coordinator went away"),
        "{}",
        far.stderr()
    );
    assert!(near.wait_timeout(Duration::from_secs(10)).is_some());
}

/// Item 4: a worker whose messages stop reaching the coordinator (its link stalls one way
/// for 5 s) is lost after the 2 s heartbeat timeout and fenced: it is told to stop (the other
/// way still works), what it sends afterwards — reports, request records — is not counted
/// when the stall ends, and what it had not started is replayed once by the survivor. The
/// report accounts for every exchange exactly once and agrees with `--requests-out`.
#[test]
fn a_lost_worker_is_fenced_and_its_unstarted_exchanges_are_replayed_once() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("fence");
    let log = dir.join("requests.jsonl");
    let mock = mock(&log);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 240, 20, None);
    let report_path = dir.join("report.json");
    let requests_out = dir.join("requests-out.jsonl");
    let (mut coordinator, addr) = coordinator(
        &[
            path(&recording),
            "--target",
            &mock.url,
            "--concurrency",
            "4",
            "--tag-requests",
            "--on-worker-loss",
            "reassign",
            "--heartbeat-timeout",
            "2s",
            "--requests-out",
            path(&requests_out),
            "--report-json",
            path(&report_path),
        ],
        2,
        &[],
    );
    let link = DelayLink::start(
        &addr,
        Direction::delay(Duration::from_millis(5)),
        Direction::delay(Duration::from_millis(5)),
    );
    let mut near = worker(&addr, "near", &[], &[]);
    let mut far = worker(link.addr(), "far", &[], &[]);
    assert!(requests_flowed(&log, 30), "{}", coordinator.stderr());
    // The far worker still hears the coordinator; the coordinator no longer hears it.
    link.stall_up_for(Duration::from_secs(5));
    let code = coordinator.wait_timeout(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{}", coordinator.stderr());
    let report = read_report(&report_path);
    identity_holds(&report, 240.0);
    assert_eq!(
        num(&report, &["requests", "not_started"]),
        0.0,
        "{report:#}"
    );
    assert!(disconnected(worker_entry(&report, "far")), "{report:#}");
    assert!(!disconnected(worker_entry(&report, "near")), "{report:#}");
    requests_out_agrees(&report, &request_lines(&requests_out));
    // Every exchange reached the server.
    let seen: BTreeSet<u64> = request_log(&log)
        .into_iter()
        .filter_map(|(_, exchange)| exchange)
        .collect();
    let missing: Vec<u64> = (0..240).filter(|i| !seen.contains(i)).collect();
    assert!(missing.is_empty(), "never replayed: {missing:?}");
    // The fenced worker was told to stop as soon as it was lost, over the way that works.
    let far_code = far.wait_timeout(Duration::from_secs(10));
    assert!(matches!(far_code, Some(code) if code != 0), "{far_code:?}");
    assert!(far.stderr().contains("declared lost"), "{}", far.stderr());
    assert!(
        report["warnings"].to_string().contains("reassigned"),
        "{}",
        report["warnings"]
    );
    assert_eq!(near.wait_timeout(Duration::from_secs(10)), Some(0));
}

/// Item 5: after a `fail` abort (one worker's link stalls), the survivors — on delayed links
/// of their own — deliver their final reports, which are merged: none is marked
/// disconnected, and each one's completions in the report are its `--requests-out` lines.
/// The survivors have replayed the first 60 exchanges and wait for the rest (recorded ten
/// minutes later) when the abort comes, their finished requests' tasks not reaped yet: their
/// final reports count those answered, not also lost.
#[test]
fn after_a_fail_abort_the_survivors_final_reports_are_merged() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("abort-survivors");
    let log = dir.join("requests.jsonl");
    let mock = mock(&log);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 90, 20, Some(10.0));
    move_tail_ten_minutes_later(&recording, 60);
    let report_path = dir.join("report.json");
    let requests_out = dir.join("requests-out.jsonl");
    let (mut coordinator, addr) = coordinator(
        &[
            path(&recording),
            "--target",
            &mock.url,
            "--on-worker-loss",
            "fail",
            "--heartbeat-timeout",
            "2s",
            "--requests-out",
            path(&requests_out),
            "--report-json",
            path(&report_path),
        ],
        3,
        &[],
    );
    let wan = || {
        DelayLink::start(
            &addr,
            Direction::jittery(Duration::from_millis(20), Duration::from_millis(5)),
            Direction::jittery(Duration::from_millis(20), Duration::from_millis(5)),
        )
    };
    let (link_a, link_b, link_stalled) = (wan(), wan(), wan());
    let mut a = worker(link_a.addr(), "a", &[], &[]);
    let mut b = worker(link_b.addr(), "b", &[], &[]);
    let _stalled = worker(link_stalled.addr(), "stalled", &[], &[]);
    assert!(requests_flowed(&log, 60), "{}", coordinator.stderr());
    link_stalled.set_stalled(true);
    let code = coordinator.wait_timeout(Duration::from_secs(30));
    assert_eq!(code, Some(3), "{}", coordinator.stderr());
    let report = read_report(&report_path);
    identity_holds(&report, 90.0);
    assert!(disconnected(worker_entry(&report, "stalled")), "{report:#}");
    for survivor in ["a", "b"] {
        let entry = worker_entry(&report, survivor);
        assert!(!disconnected(entry), "survivor {survivor}: {report:#}");
        assert_eq!(num(entry, &["completed"]), 20.0, "{report:#}");
        assert_eq!(num(entry, &["lost"]), 0.0, "{report:#}");
    }
    assert!(
        !report["warnings"].to_string().contains("invalid report"),
        "{}",
        report["warnings"]
    );
    requests_out_agrees(&report, &request_lines(&requests_out));
    for survivor in [&mut a, &mut b] {
        let code = survivor.wait_timeout(Duration::from_secs(10));
        assert!(code.is_some(), "a survivor did not exit");
        assert!(
            survivor.stderr().contains("aborted the run"),
            "{}",
            survivor.stderr()
        );
    }
}

/// Item 6 (the heartbeat timeout): a remote worker takes the run's `--heartbeat-timeout`
/// (5 s) from its assignment over its own (2 s, standing for the 5 s default against a
/// longer run timeout): a 3 s stall of its link stops neither side, and the run completes
/// with every exchange.
#[test]
fn a_remote_worker_takes_the_runs_heartbeat_timeout_from_its_assignment() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("run-heartbeat");
    let log = dir.join("requests.jsonl");
    let mock = mock(&log);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 120, 20, None);
    let report_path = dir.join("report.json");
    let (mut coordinator, addr) = coordinator(
        &[
            path(&recording),
            "--target",
            &mock.url,
            "--concurrency",
            "2",
            "--heartbeat-timeout",
            "5s",
            "--report-json",
            path(&report_path),
        ],
        1,
        &[],
    );
    let link = DelayLink::start(
        &addr,
        Direction::delay(Duration::from_millis(5)),
        Direction::delay(Duration::from_millis(5)),
    );
    let mut far = worker(link.addr(), "far", &["--heartbeat-timeout", "2s"], &[]);
    assert!(requests_flowed(&log, 10), "{}", coordinator.stderr());
    link.stall_for(Duration::from_secs(3));
    let code = coordinator.wait_timeout(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{}\n{}", coordinator.stderr(), far.stderr());
    let report = read_report(&report_path);
    identity_holds(&report, 120.0);
    assert_eq!(
        num(&report, &["requests", "succeeded"]),
        120.0,
        "{report:#}"
    );
    assert!(!disconnected(worker_entry(&report, "far")), "{report:#}");
    assert_eq!(
        far.wait_timeout(Duration::from_secs(10)),
        Some(0),
        "{}",
        far.stderr()
    );
}

/// Item 6 (the final count): a worker that gives up on its own — it stops hearing the
/// coordinator while its own messages still arrive — sends a final report that accounts for
/// exactly the exchanges it was sent: the 20 it replayed (finished, their tasks not yet
/// reaped) are answered, not also lost, and the one it was still waiting for (recorded 10
/// minutes later) is not started.
#[test]
fn a_worker_that_gives_up_on_its_own_accounts_for_exactly_what_it_was_sent() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("give-up-count");
    let log = dir.join("requests.jsonl");
    let mock = mock(&log);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 21, 20, Some(10.0));
    move_tail_ten_minutes_later(&recording, 20);
    let report_path = dir.join("report.json");
    let (mut coordinator, addr) = coordinator(
        &[
            path(&recording),
            "--target",
            &mock.url,
            "--heartbeat-timeout",
            "2s",
            "--report-json",
            path(&report_path),
        ],
        1,
        &[],
    );
    let link = DelayLink::start(
        &addr,
        Direction::delay(Duration::from_millis(5)),
        Direction::delay(Duration::from_millis(5)),
    );
    let mut far = worker(link.addr(), "far", &["--heartbeat-timeout", "2s"], &[]);
    assert!(requests_flowed(&log, 20), "{}", coordinator.stderr());
    // The worker gives up 2 s later: by then every answer (~120 ms each) is in.
    link.set_stalled_down(true);
    let code = coordinator.wait_timeout(Duration::from_secs(30));
    let report = read_report(&report_path);
    eprintln!("coordinator exit {code:?}; warnings {}", report["warnings"]);
    identity_holds(&report, 21.0);
    assert_eq!(num(&report, &["requests", "succeeded"]), 20.0, "{report:#}");
    assert_eq!(num(&report, &["requests", "lost"]), 0.0, "{report:#}");
    assert_eq!(
        num(&report, &["requests", "not_started"]),
        1.0,
        "{report:#}"
    );
    assert!(
        !report["warnings"].to_string().contains("invalid report"),
        "{}",
        report["warnings"]
    );
    assert!(!disconnected(worker_entry(&report, "far")), "{report:#}");
    // It stopped on its own with work left: a lost worker under `fail`, named with its
    // reason, and the run is not a pass (issue 31 item 2).
    assert_eq!(code, Some(3), "{}", coordinator.stderr());
    let quit = worker_entry(&report, "far")["quit"].to_string();
    assert!(quit.contains("coordinator went away"), "{report:#}");
    let far_code = far.wait_timeout(Duration::from_secs(10));
    assert!(matches!(far_code, Some(code) if code != 0), "{far_code:?}");
    assert!(
        far.stderr().contains("coordinator went away"),
        "{}",
        far.stderr()
    );
}

/// Item 7: after a reassignment on a recorded schedule, the survivor sends the lost worker's
/// past-due exchanges as soon as it gets them: their lateness before they arrived is not
/// schedule lag of its own (each one's lag in `--requests-out` is the survivor's own, not the
/// seconds it was overdue, and no "saturated" warning), nor out of `at_ms` order beyond
/// `--reorder-window`.
#[test]
fn reassigned_exchanges_are_neither_lag_nor_out_of_order_on_the_survivor() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("reassign-warnings");
    let log = dir.join("requests.jsonl");
    let mock = mock(&log);
    let recording = dir.join("rec.jsonl");
    // 300 exchanges 20 ms apart: a 6 s schedule.
    write_chat_recording(&recording, 300, 20, Some(20.0));
    let report_path = dir.join("report.json");
    let requests_out = dir.join("requests-out.jsonl");
    let (mut coordinator, addr) = coordinator(
        &[
            path(&recording),
            "--target",
            &mock.url,
            "--on-worker-loss",
            "reassign",
            "--heartbeat-timeout",
            "2s",
            "--requests-out",
            path(&requests_out),
            "--report-json",
            path(&report_path),
        ],
        2,
        &[],
    );
    let link = DelayLink::start(
        &addr,
        Direction::delay(Duration::from_millis(5)),
        Direction::delay(Duration::from_millis(5)),
    );
    let mut near = worker(&addr, "near", &[], &[]);
    let _far = worker(link.addr(), "far", &[], &[]);
    assert!(requests_flowed(&log, 20), "{}", coordinator.stderr());
    link.stall_up_for(Duration::from_secs(4));
    let code = coordinator.wait_timeout(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{}", coordinator.stderr());
    let report = read_report(&report_path);
    identity_holds(&report, 300.0);
    let warnings = report["warnings"].to_string();
    assert!(warnings.contains("reassigned"), "{warnings}");
    // (The survivor's own lag is checked below, per handed-over exchange: the "sent late"
    // warning also answers to the machine's load, which this test does not control.)
    for false_alarm in ["was saturated", "out of at_ms order"] {
        assert!(!warnings.contains(false_alarm), "{false_alarm}: {warnings}");
    }
    // The exchanges striped to the far worker that the near one replayed were handed over;
    // many of them were overdue by up to 2 s when they arrived.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&requests_out)
        .expect("--requests-out")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let stripe = |line: &serde_json::Value| line["index"].as_u64().expect("index") % 2;
    // Exchanges are striped by join place: `run.workers` lists the workers in that order.
    let far_stripe = report["run"]["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .position(|w| w["id"] == "far")
        .expect("the far worker is listed") as u64;
    let handed_over: Vec<f64> = lines
        .iter()
        .filter(|l| l["worker"] == "near" && stripe(l) == far_stripe)
        .map(|l| {
            l["schedule_lag_ms"]
                .as_f64()
                .expect("a scheduled send has a lag")
        })
        .collect();
    let late: Vec<f64> = handed_over
        .iter()
        .copied()
        .filter(|lag| *lag > 100.0)
        .collect();
    eprintln!(
        "{} handed-over exchanges, {} with a lag over 100 ms: {late:?}",
        handed_over.len(),
        late.len()
    );
    assert!(handed_over.len() >= 50, "{}", handed_over.len());
    assert!(late.len() <= 2, "lag of handed-over exchanges: {late:?}");
    assert_eq!(near.wait_timeout(Duration::from_secs(10)), Some(0));
}

/// Issue 31 items 8 and 9: a worker lost by silence — its link stalls both ways for good —
/// is handed over without duplicates: it started only what the coordinator granted
/// (protocol 5), the survivor gets only what was never granted, and what was granted after
/// the lost worker's last report is counted lost (it may have reached the server), never
/// "not started". Returns the coordinator's exit code, the report, and how many times the
/// server saw each exchange.
fn silent_loss(policy: &str) -> (Option<i32>, serde_json::Value, BTreeMap<u64, usize>) {
    let dir = TempDir::new(&format!("silent-loss-{policy}"));
    let log = dir.join("requests.jsonl");
    let mock = mock(&log);
    let recording = dir.join("rec.jsonl");
    // 600 exchanges 10 ms apart: 6 s of a recorded schedule, 50 a second on each worker.
    write_chat_recording(&recording, 600, 20, Some(10.0));
    let report_path = dir.join("report.json");
    let (mut coordinator, addr) = coordinator(
        &[
            path(&recording),
            "--target",
            &mock.url,
            "--tag-requests",
            "--on-worker-loss",
            policy,
            "--heartbeat-timeout",
            "2s",
            "--report-json",
            path(&report_path),
        ],
        2,
        &[],
    );
    let link = DelayLink::start(
        &addr,
        Direction::delay(Duration::from_millis(5)),
        Direction::delay(Duration::from_millis(5)),
    );
    let _near = worker(&addr, "near", &[], &[]);
    let _far = worker(link.addr(), "far", &[], &[]);
    assert!(requests_flowed(&log, 60), "{}", coordinator.stderr());
    // Nothing more passes either way: the coordinator hears nothing from `far` (not even a
    // final report), and `far` hears no grant.
    link.set_stalled(true);
    let code = coordinator.wait_timeout(Duration::from_secs(60));
    eprintln!("{}", coordinator.stderr());
    let report = read_report(&report_path);
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, exchange) in request_log(&log) {
        *seen.entry(exchange.expect("tagged")).or_default() += 1;
    }
    (code, report, seen)
}

#[test]
fn a_silent_worker_is_handed_over_without_duplicates() {
    let _parallel = parallel_lock();
    let (code, report, seen) = silent_loss("reassign");
    assert_eq!(code, Some(0), "{report:#}");
    identity_holds(&report, 600.0);
    let r = |k: &str| num(&report, &["requests", k]);
    let twice: Vec<u64> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(i, _)| *i)
        .collect();
    assert!(twice.is_empty(), "reached the server twice: {twice:?}");
    // Not started is only what nobody sent: here, nothing.
    assert_eq!(r("not_started"), 0.0, "{report:#}");
    // What the server never saw is counted lost (granted to the lost worker, perhaps never
    // sent), and the lost worker's granted-but-unreported exchanges are named.
    let never_seen = 600 - seen.len();
    eprintln!(
        "never reached the server: {never_seen}; counted lost: {}",
        r("lost")
    );
    assert!(
        r("lost") >= never_seen as f64,
        "{never_seen} never reached the server, {} counted lost: {report:#}",
        r("lost")
    );
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("may have reached the server"),
        "{warnings}"
    );
    assert!(disconnected(worker_entry(&report, "far")), "{report:#}");
}

#[test]
fn a_silent_workers_sends_are_lost_not_unstarted_under_fail() {
    let _parallel = parallel_lock();
    let (code, report, seen) = silent_loss("fail");
    assert_ne!(code, Some(0), "{report:#}");
    identity_holds(&report, 600.0);
    let not_started = num(&report, &["requests", "not_started"]);
    // Every exchange the server saw was sent: none of them is counted "not started".
    assert!(
        seen.len() as f64 + not_started <= 600.0,
        "{} reached the server, yet {not_started} of 600 are counted not started: {report:#}",
        seen.len()
    );
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
}
