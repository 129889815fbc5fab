//! Hostile workers (issue 7, items 7, 12, 24): a peer written here that speaks the real gRPC
//! protocol to a real coordinator process, joins, answers the clock pings, takes its slice,
//! and then sends a report no honest worker would. The coordinator must drop that peer as a
//! lost worker, named in the report, and keep every other worker's data.

use std::io::Write;
use std::time::Duration;

use common::metrics::RunMetrics;
use fixtures::peer::{Peer, now_ns};
use fixtures::{MockServer, TempDir, coordinator, num, worker, write_chat_recording};
use proto::v1;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// What the hostile worker lies about.
#[derive(Clone, Copy, Debug)]
enum Lie {
    /// A ~60-byte histogram whose header claims a 2 GB payload.
    HistogramBomb,
    /// 1,000 successes for a slice of a few exchanges.
    TooManySuccesses,
    /// Counters whose sum wraps a u64.
    Overflow,
    /// Answers every clock ping twice.
    DoublePong,
    /// Never answers a clock ping (but keeps its stream open).
    NoPong,
    /// 100,000 request records for a slice of a few exchanges (issue 18, item 12).
    RecordFlood,
    /// Output tokens of 2^64 - 50 for a few requests: added to the others, the total wraps
    /// to a small number (issue 18, item 13).
    TokenWrap,
    /// More good requests (met every `--slo`) than succeeded ones (issue 21).
    GoodPastSucceeded,
    /// Steady-window metrics counting more successes than the report itself (issue 21).
    SteadyPastReport,
}

/// The run's token: the hostile peers know it (they are workers of the run gone bad).
const TOKEN: &str = "hostile-peers-know-this-token-0123";

fn bomb() -> Vec<u8> {
    let mut inner = Vec::new();
    inner.extend_from_slice(&(0x1c84_9303u32 | 0x10).to_be_bytes());
    inner.extend_from_slice(&0x7fff_fff0u32.to_be_bytes());
    inner.extend_from_slice(&0u32.to_be_bytes());
    inner.extend_from_slice(&3u32.to_be_bytes());
    inner.extend_from_slice(&1u64.to_be_bytes());
    inner.extend_from_slice(&(1u64 << 40).to_be_bytes());
    inner.extend_from_slice(&1f64.to_bits().to_be_bytes());
    let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    zlib.write_all(&inner).expect("compress");
    let compressed = zlib.finish().expect("compress");
    let mut out = Vec::new();
    out.extend_from_slice(&(0x1c84_9304u32 | 0x10).to_be_bytes());
    out.extend_from_slice(&(compressed.len() as u32).to_be_bytes());
    out.extend_from_slice(&compressed);
    out
}

fn lying_report(lie: Lie) -> v1::Report {
    let mut histograms = RunMetrics::new().encode_histograms();
    let mut counters = v1::Counters::default();
    match lie {
        Lie::HistogramBomb => histograms[0] = bomb(),
        Lie::TooManySuccesses => {
            counters.succeeded = 1_000;
            counters.issued = 1_000;
        }
        Lie::Overflow => {
            counters.succeeded = u64::MAX - 1;
            counters.failed_status = 5;
            counters.issued = u64::MAX;
        }
        Lie::TokenWrap => {
            counters.succeeded = 2;
            counters.issued = 2;
            counters.output_tokens = u64::MAX - 49;
        }
        Lie::GoodPastSucceeded => {
            counters.succeeded = 1;
            counters.issued = 1;
            counters.good = 2;
        }
        Lie::SteadyPastReport => {
            counters.succeeded = 1;
            counters.issued = 1;
        }
        Lie::DoublePong | Lie::NoPong | Lie::RecordFlood => {}
    }
    let steady = matches!(lie, Lie::SteadyPastReport).then(|| v1::Metrics {
        histograms: RunMetrics::new().encode_histograms(),
        counters: Some(v1::Counters {
            succeeded: 3,
            ..Default::default()
        }),
        ..Default::default()
    });
    v1::Report {
        seq: 1,
        r#final: false,
        histograms,
        counters: Some(counters),
        steady,
        ..Default::default()
    }
}

/// Join `addr` as `id` (with the run's token: a peer that knows it), say so on `joined`, play
/// along until the start, send the lie, then keep heartbeating until the coordinator goes
/// away.
async fn hostile_worker(
    addr: String,
    id: &str,
    lie: Lie,
    joined: Option<std::sync::mpsc::Sender<()>>,
) {
    let mut peer = Peer::join(&addr, id, Some(TOKEN))
        .await
        .expect("the hostile peer joins");
    if let Some(joined) = joined {
        let _ = joined.send(());
    }
    let mut slice = peer.drain_slice().await.expect("slice");
    let handed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let handed = handed.clone();
        tokio::spawn(async move {
            while let Some(n) = slice.recv().await {
                handed.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }
    loop {
        match peer.recv().await {
            Some(v1::coordinator_message::Msg::ClockPing(ping)) => {
                let answers = match lie {
                    Lie::NoPong => 0,
                    Lie::DoublePong => 2,
                    _ => 1,
                };
                for _ in 0..answers {
                    let t = now_ns();
                    peer.send(v1::worker_message::Msg::ClockPong(v1::ClockPong {
                        seq: ping.seq,
                        coordinator_send_unix_ns: ping.coordinator_send_unix_ns,
                        worker_receive_unix_ns: t,
                        worker_send_unix_ns: t,
                    }))
                    .await;
                }
            }
            Some(v1::coordinator_message::Msg::Start(_)) => break,
            Some(_) => {}
            None => return,
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Lie::RecordFlood = lie {
        // Thousands of request records for the few exchanges it was handed.
        let record = |index| v1::RequestRecord {
            index,
            outcome: "succeeded".into(),
            output_tokens: 5,
            ..Default::default()
        };
        for batch in 0..100u64 {
            let records = (0..1_000).map(|i| record(batch * 1_000 + i)).collect();
            if !peer
                .send(v1::worker_message::Msg::Records(v1::RequestRecords {
                    records,
                }))
                .await
            {
                break;
            }
        }
        println!(
            "the flooding peer was handed {} exchanges",
            handed.load(std::sync::atomic::Ordering::Relaxed)
        );
    } else {
        peer.send(v1::worker_message::Msg::Report(lying_report(lie)))
            .await;
    }
    loop {
        let heartbeat = v1::worker_message::Msg::Heartbeat(v1::Heartbeat { unix_ns: now_ns() });
        if !peer.send(heartbeat).await {
            return;
        }
        tokio::select! {
            message = peer.recv() => if message.is_none() { return },
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

fn run_with_a_liar(lie: Lie) {
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "2ms", "--tokens", "5"]);
    let dir = TempDir::new("hostile");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 40, 5, None);
    let report_path = dir.join("report.json");
    let requests_out = dir.join("requests.jsonl");
    let (mut coordinator, addr) = coordinator(
        &[
            recording.to_str().expect("utf-8"),
            "--target",
            &mock.url,
            "--concurrency",
            "4",
            "--on-worker-loss",
            "reassign",
            "--report-json",
            report_path.to_str().expect("utf-8"),
            "--requests-out",
            requests_out.to_str().expect("utf-8"),
            "--token",
            TOKEN,
        ],
        2,
        &[],
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (joined, liar_joined) = std::sync::mpsc::channel();
    let liar = runtime.spawn(hostile_worker(addr.clone(), "liar", lie, Some(joined)));
    // The liar joins first, so it gets a share of the slice.
    liar_joined
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{lie:?}: the liar did not join: {}", coordinator.stderr()));
    let honest = worker(&addr, "honest", &["--token", TOKEN], &[]);
    let code = coordinator.wait_timeout(Duration::from_secs(60));
    liar.abort();
    drop(honest);
    assert_eq!(
        code,
        Some(0),
        "{lie:?}: {}\n{}",
        coordinator.stdout(),
        coordinator.stderr()
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report_path).expect("report"))
            .expect("JSON");
    println!(
        "{lie:?}: total {} succeeded {}",
        num(&report, &["requests", "total"]),
        num(&report, &["requests", "succeeded"])
    );
    // Nothing the liar claimed is counted; every exchange was replayed by the honest worker.
    assert_eq!(num(&report, &["requests", "total"]), 40.0, "{report:#}");
    assert_eq!(num(&report, &["requests", "succeeded"]), 40.0, "{report:#}");
    let output = coordinator.stdout();
    assert!(
        output.contains("liar") && output.contains("invalid report"),
        "the liar is not named: {output}"
    );
    // The reason a user reads names the counts that cannot hold together.
    let reason = match lie {
        Lie::GoodPastSucceeded => Some("good 2 of 1 succeeded"),
        Lie::SteadyPastReport => Some("steady metrics: succeeded 3 of 1 in the whole report"),
        _ => None,
    };
    if let Some(reason) = reason {
        assert!(output.contains(reason), "{lie:?}: {output}");
    }
    let workers = report["run"]["workers"].as_array().expect("workers");
    let liar_row = workers
        .iter()
        .find(|w| w["id"] == "liar")
        .expect("the liar is listed");
    assert_eq!(liar_row["disconnected"], true, "{liar_row}");
    // Every line of --requests-out is a request some worker could have measured: the
    // honest worker's 40 at most, and the liar's within what it was handed.
    let lines = std::fs::read_to_string(&requests_out)
        .expect("requests-out")
        .lines()
        .count();
    assert!(
        lines <= 80,
        "{lie:?}: {lines} request records for 40 exchanges"
    );
}

#[test]
fn a_histogram_bomb_drops_the_peer_and_keeps_the_rest() {
    let _parallel = fixtures::parallel_lock();
    run_with_a_liar(Lie::HistogramBomb);
}

#[test]
fn a_worker_claiming_more_than_it_was_sent_is_dropped() {
    let _parallel = fixtures::parallel_lock();
    run_with_a_liar(Lie::TooManySuccesses);
}

#[test]
fn a_peer_flooding_request_records_is_dropped() {
    let _parallel = fixtures::parallel_lock();
    run_with_a_liar(Lie::RecordFlood);
}

#[test]
fn output_tokens_that_would_wrap_the_total_are_refused() {
    let _parallel = fixtures::parallel_lock();
    run_with_a_liar(Lie::TokenWrap);
}

#[test]
fn counters_that_wrap_are_refused() {
    let _parallel = fixtures::parallel_lock();
    run_with_a_liar(Lie::Overflow);
}

#[test]
fn more_good_requests_than_succeeded_ones_are_refused() {
    let _parallel = fixtures::parallel_lock();
    run_with_a_liar(Lie::GoodPastSucceeded);
}

#[test]
fn steady_metrics_past_the_reports_own_counts_are_refused() {
    let _parallel = fixtures::parallel_lock();
    run_with_a_liar(Lie::SteadyPastReport);
}

/// A peer that accepts workers like a coordinator but does not know their token: it either
/// skips the challenge or fakes its proof, and asks for `${HOME}` in a header.
struct FakeCoordinator {
    fake_proof: bool,
    hello_tokens: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

type Stream<T> =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl v1::coordinator_server::Coordinator for FakeCoordinator {
    type JoinStream = Stream<v1::CoordinatorMessage>;
    type ExchangesStream = Stream<v1::ExchangeChunk>;

    async fn join(
        &self,
        request: tonic::Request<tonic::Streaming<v1::WorkerMessage>>,
    ) -> Result<tonic::Response<Self::JoinStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        if let Ok(Some(v1::WorkerMessage {
            msg: Some(v1::worker_message::Msg::Hello(hello)),
        })) = inbound.message().await
        {
            self.hello_tokens.lock().expect("lock").push(hello.token);
        }
        let (tx, rx) = mpsc::channel(4);
        let message = |msg| Ok(v1::CoordinatorMessage { msg: Some(msg) });
        if self.fake_proof {
            let _ = tx
                .send(message(v1::coordinator_message::Msg::Challenge(
                    v1::Challenge {
                        nonce: Vec::new(),
                        proof: vec![7; 32],
                        pake: vec![7; 33],
                    },
                )))
                .await;
        }
        let _ = tx
            .send(message(v1::coordinator_message::Msg::Assignment(
                v1::Assignment {
                    run_id: "fake".into(),
                    target: "http://127.0.0.1:9".into(),
                    headers: vec![v1::Header {
                        name: "x-leak".into(),
                        value: "${HOME}".into(),
                    }],
                    ..Default::default()
                },
            )))
            .await;
        tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
        Ok(tonic::Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn exchanges(
        &self,
        _request: tonic::Request<v1::SliceRequest>,
    ) -> Result<tonic::Response<Self::ExchangesStream>, tonic::Status> {
        Err(tonic::Status::unavailable("fake"))
    }
}

/// Item 3: a worker with a token trusts nothing from a peer that cannot prove it knows the
/// token, and the token itself never crosses the link.
#[test]
fn a_worker_does_not_trust_a_peer_that_cannot_prove_the_token() {
    let _parallel = fixtures::parallel_lock();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    for fake_proof in [false, true] {
        let hello_tokens = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let service = v1::coordinator_server::CoordinatorServer::new(FakeCoordinator {
            fake_proof,
            hello_tokens: hello_tokens.clone(),
        });
        let server = runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut worker = worker(
            &addr,
            "careful",
            &[
                "--token",
                "a-long-enough-shared-token",
                "--allow-env",
                "HOME",
            ],
            &[],
        );
        let code = worker.wait_timeout(Duration::from_secs(20));
        server.abort();
        let stderr = worker.stderr();
        println!("fake proof {fake_proof}: {stderr}");
        assert!(matches!(code, Some(c) if c != 0), "{code:?}: {stderr}");
        assert!(
            stderr.contains("not trusted") && stderr.contains("prov"),
            "the worker did not say why: {stderr}"
        );
        let tokens = hello_tokens.lock().expect("lock").clone();
        assert_eq!(tokens.len(), 1);
        assert!(
            !tokens[0].contains("a-long-enough"),
            "the token crossed the link"
        );
        assert!(!worker.stdout().contains("ready"), "{}", worker.stdout());
    }
}

/// Item 3: a coordinator's `--header '${VAR}'` expands only variables the worker allows.
#[test]
fn a_worker_expands_only_the_variables_it_allows() {
    let _parallel = fixtures::parallel_lock();
    let server = crate::raw_server::start_gateway(crate::raw_server::Gateway {
        content_type: Some("text/event-stream"),
        hold_after_done: Duration::ZERO,
        big_body: None,
    });
    let dir = TempDir::new("allow-env");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 2, 5, None);
    for allow in [false, true] {
        let (mut coordinator, addr) = coordinator(
            &[
                recording.to_str().expect("utf-8"),
                "--target",
                &server.url,
                "--header",
                "x-leak: ${LEAK_ME}",
                "--join-timeout",
                "20s",
            ],
            1,
            &[],
        );
        let mut args = vec![];
        if allow {
            args.extend(["--allow-env", "LEAK_ME"]);
        }
        let mut w = worker(&addr, "w", &args, &[("LEAK_ME", "top-secret-value")]);
        let code = coordinator.wait_timeout(Duration::from_secs(40));
        let _ = w.wait_timeout(Duration::from_secs(10));
        let heads = server.heads.lock().expect("heads").join("\n");
        if allow {
            assert_eq!(code, Some(0), "{}", coordinator.stderr());
            assert!(heads.contains("top-secret-value"), "{heads}");
        } else {
            assert!(
                matches!(code, Some(c) if c != 0),
                "{}",
                coordinator.stderr()
            );
            assert!(w.stderr().contains("--allow-env LEAK_ME"), "{}", w.stderr());
            assert!(!heads.contains("top-secret-value"), "{heads}");
        }
    }
}

/// Item 25: one worker answering every clock ping twice does not stand in for a worker that
/// never answers: the coordinator stops at the clock sync instead of starting a run that
/// cannot finish.
#[test]
fn a_duplicate_pong_does_not_stand_in_for_a_missing_one() {
    let _parallel = fixtures::parallel_lock();
    let mock = MockServer::start(&["--ttft", "5ms", "--itl", "2ms", "--tokens", "5"]);
    let dir = TempDir::new("pongs");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 10, 5, None);
    let (mut coordinator, addr) = coordinator(
        &[
            recording.to_str().expect("utf-8"),
            "--target",
            &mock.url,
            "--concurrency",
            "2",
        ],
        2,
        &[],
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let double = runtime.spawn(hostile_worker(
        addr.clone(),
        "double",
        Lie::DoublePong,
        None,
    ));
    let mute = runtime.spawn(hostile_worker(addr.clone(), "mute", Lie::NoPong, None));
    let code = coordinator.wait_timeout(Duration::from_secs(30));
    double.abort();
    mute.abort();
    let stderr = coordinator.stderr();
    println!("{stderr}");
    assert_eq!(
        code,
        Some(3),
        "the run did not stop at the clock sync: {stderr}"
    );
    assert!(stderr.contains("clock ping"), "{stderr}");
}
