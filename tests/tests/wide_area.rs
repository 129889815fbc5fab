//! Issue 19 (real networks): the distributed run when workers do not all arrive at once.

use std::time::Duration;

use fixtures::link::{DelayLink, Direction};
use fixtures::{MockServer, TempDir, coordinator, num, worker, write_chat_recording};

/// Item 1: a worker that joins 4 s before the last one (twice its own 2 s heartbeat timeout)
/// hears the coordinator's heartbeats (every 0.5 s) meanwhile and takes part in the run;
/// only `--join-timeout` bounds the wait. On loopback.
#[test]
fn an_early_worker_waits_for_a_late_one_beyond_its_heartbeat_timeout() {
    let _parallel = fixtures::parallel_lock();
    early_and_late(None);
}

/// Item 1 over a wide-area link: both workers dial through a delay proxy of 120 ms each way
/// with ±40 ms jitter (a 160–320 ms round trip), the early one 4 s before the late one.
#[test]
fn an_early_worker_behind_a_slow_jittery_link_waits_for_a_late_one() {
    let _parallel = fixtures::parallel_lock();
    let way = Direction::jittery(Duration::from_millis(120), Duration::from_millis(40));
    early_and_late(Some((way, way)));
}

/// The early worker's own heartbeat timeout (the late one joins after twice that).
const EARLY_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// The early/late join of item 1; with `link`, each worker dials through its own delay
/// proxy timed `(up, down)`.
fn early_and_late(link: Option<(Direction, Direction)>) {
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "2ms", "--tokens", "5"]);
    let dir = TempDir::new("late-join");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 20, 5, None);
    let report_path = dir.join("report.json");
    let (mut coordinator, addr) = coordinator(
        &[
            recording.to_str().expect("utf-8"),
            "--target",
            &mock.url,
            "--concurrency",
            "2",
            "--join-timeout",
            "60s",
            "--report-json",
            report_path.to_str().expect("utf-8"),
        ],
        2,
        &[],
    );
    let links: Vec<DelayLink> = link
        .map(|(up, down)| (0..2).map(|_| DelayLink::start(&addr, up, down)).collect())
        .unwrap_or_default();
    let dial = |i: usize| {
        links.get(i).map_or_else(
            || addr.clone(),
            |l| {
                if addr.starts_with("http://") {
                    format!("http://{}", l.addr())
                } else {
                    l.addr().to_owned()
                }
            },
        )
    };
    let mut early = worker(
        &dial(0),
        "early",
        &[
            "--heartbeat-timeout",
            &format!("{}s", EARLY_HEARTBEAT_TIMEOUT.as_secs()),
        ],
        &[],
    );
    // The early worker has joined: it says so.
    assert!(
        fixtures::eventually(Duration::from_secs(20), || format!(
            "{}{}",
            early.stdout(),
            early.stderr()
        )
        .contains("joined run")),
        "the early worker did not join: {}",
        early.stderr()
    );
    // The subject: twice the early worker's heartbeat timeout with no other worker there.
    std::thread::sleep(2 * EARLY_HEARTBEAT_TIMEOUT);
    assert_eq!(
        early.wait_timeout(Duration::ZERO),
        None,
        "the early worker gave up while waiting: {}",
        early.stderr()
    );
    let mut late = worker(&dial(1), "late", &[], &[]);
    let code = coordinator.wait_timeout(Duration::from_secs(60));
    let _ = late.wait_timeout(Duration::from_secs(10));
    let _ = early.wait_timeout(Duration::from_secs(10));
    assert_eq!(code, Some(0), "{}", coordinator.stderr());
    // The workers really went through their links.
    for link in &links {
        assert!(link.connections() >= 1, "a worker bypassed its link");
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report_path).expect("report"))
            .expect("JSON");
    assert_eq!(num(&report, &["requests", "succeeded"]), 20.0, "{report:#}");
    let workers = report["run"]["workers"].as_array().expect("workers");
    assert!(
        workers
            .iter()
            .all(|w| w["completed"].as_f64().unwrap_or(0.0) > 0.0),
        "{workers:?}"
    );
}

/// Item 8: the certificate most people make for a private server — self-signed, with
/// `CA:TRUE` (what `openssl req -x509 -addext subjectAltName=...` writes) — given as
/// `--target-ca` is trusted, as curl `--cacert` and Python's `ssl` trust it; for another
/// host name it is still refused.
#[test]
fn a_self_signed_ca_certificate_given_as_target_ca_is_trusted() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("self-signed-ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "localhost");
    let cert = params.self_signed(&key).expect("certificate");
    let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 6, 5, None);
    let mock = MockServer::start(&[
        "--ttft",
        "2ms",
        "--itl",
        "1ms",
        "--tls-cert",
        cert_path.to_str().expect("utf-8"),
        "--tls-key",
        key_path.to_str().expect("utf-8"),
    ]);
    let report_path = dir.join("report.json");
    let out = fixtures::llm_replay(
        &[
            "run",
            recording.to_str().expect("utf-8"),
            "--target",
            &mock.url.replace("127.0.0.1", "localhost"),
            "--target-ca",
            cert_path.to_str().expect("utf-8"),
            "--schedule",
            "asap",
        ],
        Some(&report_path),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report = out.report.expect("report");
    assert_eq!(num(&report, &["requests", "succeeded"]), 6.0, "{report:#}");
    // The same certificate does not vouch for a name it does not carry.
    let wrong_name = fixtures::llm_replay(
        &[
            "run",
            recording.to_str().expect("utf-8"),
            "--target",
            // The certificate names localhost only.
            &mock.url,
            "--target-ca",
            cert_path.to_str().expect("utf-8"),
            "--schedule",
            "asap",
        ],
        None,
    );
    assert_ne!(wrong_name.code, 0, "{}", wrong_name.stdout);
    assert!(
        format!("{}{}", wrong_name.stdout, wrong_name.stderr).contains("name mismatch"),
        "{}\n{}",
        wrong_name.stdout,
        wrong_name.stderr
    );
}

/// Item 14: a run in which every request got an HTTP 500 exits 3 (PRODUCT.md: no request
/// succeeded), with the report written and the status named.
#[test]
fn a_run_where_no_request_succeeded_exits_3_with_its_report() {
    let _parallel = fixtures::parallel_lock();
    let mock = MockServer::start(&["--ttft", "2ms", "--itl", "1ms", "--fail-rate", "1"]);
    let dir = TempDir::new("none-succeeded");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 8, 5, None);
    let report_path = dir.join("report.json");
    let out = fixtures::llm_replay(
        &[
            "run",
            recording.to_str().expect("utf-8"),
            "--target",
            &mock.url,
            "--schedule",
            "asap",
        ],
        Some(&report_path),
    );
    assert_eq!(out.code, 3, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("no request") && out.stderr.contains("500"),
        "{}",
        out.stderr
    );
    let report = out.report.expect("the report is written");
    assert_eq!(num(&report, &["requests", "failed"]), 8.0, "{report:#}");
}
