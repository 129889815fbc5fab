//! Issue 31: a run that passes did all its work. Remote workers started as the shipped
//! examples start them (`--once`), each behind its own wide-area link (25 ± 10 ms each way,
//! `fixtures::link::DelayLink`), take every level of a sweep and every probe of a capacity
//! search on one join; a worker that stops on its own (its link to the coordinator stalls
//! one way) is a lost worker under the run's policy, not a finished one; a relay on the path
//! that cuts or repeats a worker's slice makes the run exit 3, naming the worker and why.
//! Real processes over real sockets throughout; the relay is a gRPC server of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fixtures::link::{DelayLink, Direction};
use fixtures::{
    MockServer, Spawned, TempDir, coordinator, eventually, num, parallel_lock, worker,
    write_chat_recording,
};
use proto::v1;
use proto::v1::coordinator_client::CoordinatorClient;
use tokio_stream::StreamExt;

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn read_report(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("the report is written"))
        .expect("the report is JSON")
}

/// A wide-area link: 25 ms ± 10 ms each way.
fn wan(addr: &str) -> DelayLink {
    let way = Direction::jittery(Duration::from_millis(25), Duration::from_millis(10));
    DelayLink::start(addr, way, way)
}

/// `n` remote workers started with `--once`, each behind a link of its own.
fn remote_workers(addr: &str, n: usize) -> (Vec<DelayLink>, Vec<Spawned>) {
    let links: Vec<DelayLink> = (0..n).map(|_| wan(addr)).collect();
    let workers = links
        .iter()
        .enumerate()
        .map(|(i, link)| worker(link.addr(), &format!("far-{i}"), &[], &[]))
        .collect();
    (links, workers)
}

/// Every worker exits 0 (a `--once` worker leaves when the run says it is over).
fn all_exit_cleanly(workers: &mut [Spawned]) {
    for (i, w) in workers.iter_mut().enumerate() {
        let code = w.wait_timeout(Duration::from_secs(20));
        assert_eq!(code, Some(0), "worker far-{i}: {}", w.stderr());
    }
}

/// A mock with `slots` batch slots at TTFT 5 ms and 62 ms a request (5 ms + 19 × 3 ms).
fn slotted_mock(slots: usize) -> MockServer {
    let slots = slots.to_string();
    MockServer::start(&[
        "--ttft",
        "5ms",
        "--itl",
        "3ms",
        "--tokens",
        "20",
        "--max-streams",
        &slots,
    ])
}

/// Acceptance: three `--once` workers behind 25 ± 10 ms links complete a three-level sweep:
/// they join once and take every level (before, each level re-bound its listener and the
/// `--once` workers had left after the first).
#[test]
fn remote_once_workers_take_every_level_of_a_sweep() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "10ms", "--itl", "2ms", "--tokens", "10"]);
    let dir = TempDir::new("remote-sweep");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 120, 10, None);
    let report_path = dir.join("report.json");
    let (mut coordinator, addr) = coordinator(
        &[
            path(&recording),
            "--target",
            &mock.url,
            "--sweep-concurrency",
            "4,8,16",
            "--report-json",
            path(&report_path),
        ],
        3,
        &[],
    );
    let (_links, mut workers) = remote_workers(&addr, 3);
    let code = coordinator.wait_timeout(Duration::from_secs(120));
    let stderr = coordinator.stderr();
    assert_eq!(code, Some(0), "{stderr}");
    let report = read_report(&report_path);
    let levels = report["sweep"].as_array().expect("sweep levels");
    assert_eq!(levels.len(), 3, "{:#}", report["sweep"]);
    for (level, concurrency) in levels.iter().zip([4.0, 8.0, 16.0]) {
        assert_eq!(num(level, &["concurrency"]), concurrency);
        assert_eq!(num(level, &["requests", "succeeded"]), 120.0, "{level:#}");
    }
    // Join progress is a live line, with the level it is for.
    assert!(
        stderr.contains("3 of 3 workers joined (sweep level 3 of 3: concurrency 16)"),
        "{stderr}"
    );
    all_exit_cleanly(&mut workers);
}

/// Acceptance: `--find-max concurrency` over three remote `--once` workers behind the links
/// answers the server's slot count, 4, as with local workers (4 rather than 8: the same
/// exact answer, K and K + 1, in two probes fewer). The search starts at 3, one stream a
/// worker (each runs one at least: a probe at 2 would hold 3), then 6, 4, 5 and 5 again to
/// confirm the failure; each probe runs 1.2 s, which even at 3 gets the 40 requests of 62 ms
/// a p95 goal needs (no probe runs again for want of requests: the search would answer the
/// same, a probe later). At 4 streams
/// no request waits (TTFT p95 about 5 ms); at 5, one in five waits for a slot, up to a whole
/// 62 ms request (TTFT p95 38-62 ms measured, against the goal's 27).
#[test]
fn a_capacity_search_over_remote_workers_finds_the_slot_count() {
    let _parallel = parallel_lock();
    let mock = slotted_mock(4);
    let dir = TempDir::new("remote-find-max");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 50, 20, None);
    let report_path = dir.join("report.json");
    let (mut coordinator, addr) = coordinator(
        &[
            path(&recording),
            "--target",
            &mock.url,
            "--find-max",
            "concurrency",
            "--duration",
            "1200ms",
            "--fail-if",
            "llm.ttft-p95 > 27",
            "--report-json",
            path(&report_path),
        ],
        3,
        &[],
    );
    let (_links, mut workers) = remote_workers(&addr, 3);
    let code = coordinator.wait_timeout(Duration::from_secs(240));
    assert_eq!(code, Some(0), "{}", coordinator.stderr());
    let report = read_report(&report_path);
    let capacity = &report["capacity"];
    assert_eq!(num(capacity, &["max"]), 4.0, "{capacity:#}");
    assert_eq!(num(capacity, &["min_failing"]), 5.0, "{capacity:#}");
    assert_eq!(num(capacity, &["low"]), 3.0, "{capacity:#}");
    assert_eq!(capacity["probes"][0]["value"], 3.0, "{capacity:#}");
    all_exit_cleanly(&mut workers);
}

/// A mock answering in about 30 ms, logging every request.
fn quick_mock(log: &std::path::Path) -> MockServer {
    MockServer::start(&[
        "--ttft",
        "10ms",
        "--itl",
        "2ms",
        "--tokens",
        "10",
        "--request-log",
        path(log),
    ])
}

/// The exchanges of a one-way stall's recording.
const EXCHANGES: f64 = 750.0;

/// Three workers replay 750 exchanges recorded 8 ms apart (6 s); once 150 requests went out
/// (1.2 s in), the coordinator → worker direction of `far-1`'s link stalls for 4 s. The
/// worker hears nothing for the run's heartbeat timeout (2 s here, so that it quits with
/// about 2.5 s of its slice unstarted), stops on its own and says so; its final report still
/// arrives (the other direction works). Returns the coordinator's exit code, its stderr and
/// the report.
fn one_way_stall(policy: &str) -> (Option<i32>, String, serde_json::Value) {
    let dir = TempDir::new(&format!("one-way-stall-{policy}"));
    let log = dir.join("requests.jsonl");
    let mock = quick_mock(&log);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, EXCHANGES as usize, 10, Some(8.0));
    let report_path = dir.join("report.json");
    let (mut coordinator, addr) = coordinator(
        &[
            path(&recording),
            "--target",
            &mock.url,
            "--heartbeat-timeout",
            "2s",
            "--on-worker-loss",
            policy,
            "--report-json",
            path(&report_path),
        ],
        3,
        &[],
    );
    let (links, _workers) = remote_workers(&addr, 3);
    assert!(
        eventually(Duration::from_secs(30), || {
            fixtures::request_log(&log).len() >= 150
        }),
        "{}",
        coordinator.stderr()
    );
    links[1].set_stalled_down(true);
    let stall = std::time::Instant::now();
    let mut code = coordinator.wait_timeout(Duration::from_secs(4));
    links[1].set_stalled_down(false);
    eprintln!("stalled for {:?}", stall.elapsed());
    if code.is_none() {
        code = coordinator.wait_timeout(Duration::from_secs(60));
    }
    (code, coordinator.stderr(), read_report(&report_path))
}

/// Acceptance, `fail`: a worker that stops on its own is a lost worker, so the run is not
/// exit 0, and the worker is named in the terminal and in the report.
#[test]
fn a_worker_that_stops_on_its_own_fails_the_run_under_fail() {
    let _parallel = parallel_lock();
    let (code, stderr, report) = one_way_stall("fail");
    assert_eq!(code, Some(3), "{stderr}");
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("far-1") && warnings.contains("quit"),
        "{warnings}"
    );
    assert!(
        stderr.contains("worker far-1") && stderr.contains("quit"),
        "a live line names the worker: {stderr}"
    );
    assert!(
        warnings.contains("coordinator went away"),
        "its reason reaches the report: {warnings}"
    );
    // Its final report counts what it did exactly: total is every exchange, once.
    let r = |k: &str| num(&report, &["requests", k]);
    assert_eq!(r("total"), EXCHANGES, "{:#}", report["requests"]);
}

/// Acceptance, `reassign`: what the worker that quit had not started goes to the others, so
/// every one of the 750 exchanges is sent; none is "not started".
#[test]
fn a_worker_that_stops_on_its_own_is_handed_over_under_reassign() {
    let _parallel = parallel_lock();
    let (code, stderr, report) = one_way_stall("reassign");
    let r = |k: &str| num(&report, &["requests", k]);
    assert_eq!(r("not_started"), 0.0, "{:#}\n{stderr}", report["requests"]);
    assert_eq!(r("total"), EXCHANGES, "{:#}", report["requests"]);
    assert_eq!(
        r("succeeded") + r("lost"),
        EXCHANGES,
        "{:#}",
        report["requests"]
    );
    assert_eq!(code, Some(0), "{stderr}");
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("far-1") && warnings.contains("reassigned"),
        "{warnings}"
    );
}

/// What the relay does to each slice stream.
#[derive(Clone, Copy, Debug)]
enum Tamper {
    /// Forward the first chunk, then end the stream with status OK.
    CutAfterFirst,
    /// Forward the first chunk twice.
    RepeatFirst,
}

/// A relay without the token between one worker and the coordinator: it forwards the join
/// stream untouched and tampers with the slice stream.
struct SliceRelay {
    upstream: String,
    tamper: Tamper,
    chunks: Arc<AtomicU64>,
}

type RelayStream<T> =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, tonic::Status>> + Send>>;

async fn upstream_client(
    addr: &str,
) -> Result<CoordinatorClient<tonic::transport::Channel>, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    Ok(CoordinatorClient::new(channel).max_decoding_message_size(64 * 1024 * 1024))
}

#[tonic::async_trait]
impl v1::coordinator_server::Coordinator for SliceRelay {
    type JoinStream = RelayStream<v1::CoordinatorMessage>;
    type ExchangesStream = RelayStream<v1::ExchangeChunk>;

    async fn join(
        &self,
        request: tonic::Request<tonic::Streaming<v1::WorkerMessage>>,
    ) -> Result<tonic::Response<Self::JoinStream>, tonic::Status> {
        let mut client = upstream_client(&self.upstream).await?;
        let from_worker = request
            .into_inner()
            .take_while(Result::is_ok)
            .filter_map(Result::ok);
        let from_upstream = client.join(from_worker).await?.into_inner();
        Ok(tonic::Response::new(Box::pin(from_upstream)))
    }

    async fn exchanges(
        &self,
        request: tonic::Request<v1::SliceRequest>,
    ) -> Result<tonic::Response<Self::ExchangesStream>, tonic::Status> {
        let mut client = upstream_client(&self.upstream).await?;
        let mut chunks = client.exchanges(request.into_inner()).await?.into_inner();
        let tamper = self.tamper;
        let count = self.chunks.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let Ok(Some(first)) = chunks.message().await else {
                return;
            };
            count.fetch_add(1, Ordering::Relaxed);
            let _ = tx.send(Ok(first.clone())).await;
            match tamper {
                // The stream ends here, with status OK, as if the slice were done.
                Tamper::CutAfterFirst => {}
                Tamper::RepeatFirst => {
                    let _ = tx.send(Ok(first)).await;
                    while let Ok(Some(chunk)) = chunks.message().await {
                        count.fetch_add(1, Ordering::Relaxed);
                        if tx.send(Ok(chunk)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// A run of 400 exchanges by one remote worker behind the tampering relay: the exit code,
/// the coordinator's stderr, the worker's stderr and the report.
fn run_behind_relay(
    tamper: Tamper,
    token: bool,
) -> (Option<i32>, String, String, serde_json::Value) {
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "1ms", "--tokens", "5"]);
    let dir = TempDir::new("slice-relay");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 400, 5, Some(5.0));
    let report_path = dir.join("report.json");
    const TOKEN: &str = "a-test-token-of-enough-length";
    let mut args = vec![
        path(&recording),
        "--target",
        &mock.url,
        "--fail-if",
        "llm.error-rate > 50",
        "--report-json",
        path(&report_path),
    ];
    if token {
        args.extend(["--token", TOKEN]);
    }
    let (mut coordinator, addr) = coordinator(&args, 1, &[]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let relay_addr = listener.local_addr().expect("addr").to_string();
    let chunks = Arc::new(AtomicU64::new(0));
    let relay = runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(
                v1::coordinator_server::CoordinatorServer::new(SliceRelay {
                    upstream: addr.clone(),
                    tamper,
                    chunks: chunks.clone(),
                })
                .max_decoding_message_size(64 * 1024 * 1024),
            )
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let worker_args: Vec<&str> = if token {
        vec!["--token", TOKEN]
    } else {
        Vec::new()
    };
    let mut far = worker(&relay_addr, "behind-relay", &worker_args, &[]);
    let code = coordinator.wait_timeout(Duration::from_secs(60));
    let worker_code = far.wait_timeout(Duration::from_secs(20));
    relay.abort();
    assert!(
        chunks.load(Ordering::Relaxed) >= 1,
        "the relay saw no chunk"
    );
    assert!(
        matches!(worker_code, Some(c) if c != 0),
        "the worker exited {worker_code:?}: {}",
        far.stderr()
    );
    (
        code,
        coordinator.stderr(),
        far.stderr(),
        read_report(&report_path),
    )
}

/// Acceptance: a relay that ends the slice stream early (status OK after the first chunk) is
/// a failed slice, not a short one: exit 3, the worker and its reason named, and no goal
/// passes on work that was never done.
#[test]
fn a_slice_cut_by_a_relay_fails_the_run() {
    let _parallel = parallel_lock();
    for token in [true, false] {
        let (code, stderr, worker_err, report) = run_behind_relay(Tamper::CutAfterFirst, token);
        assert_eq!(
            code,
            Some(3),
            "token {token}: {stderr}\nworker: {worker_err}"
        );
        let warnings = report["warnings"].to_string();
        assert!(
            warnings.contains("behind-relay") && warnings.contains("cut on the way"),
            "token {token}: {warnings}"
        );
        assert!(
            worker_err.contains("cut on the way"),
            "token {token}: {worker_err}"
        );
    }
}

/// Acceptance: a relay that repeats a chunk of a sealed slice: the worker refuses the slice,
/// says why, and the run exits 3 naming it.
#[test]
fn a_slice_chunk_repeated_by_a_relay_fails_the_run() {
    let _parallel = parallel_lock();
    let (code, stderr, worker_err, report) = run_behind_relay(Tamper::RepeatFirst, true);
    assert_eq!(code, Some(3), "{stderr}\nworker: {worker_err}");
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("behind-relay") && warnings.contains("authentication check"),
        "{warnings}"
    );
}
