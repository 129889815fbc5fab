//! Hostile workers (issue 7, items 7, 12, 24): a peer written here that speaks the real gRPC
//! protocol to a real coordinator process, joins, answers the clock pings, takes its slice,
//! and then sends a report no honest worker would. The coordinator must drop that peer as a
//! lost worker, named in the report, and keep every other worker's data.

use std::io::Write;
use std::time::Duration;

use common::metrics::RunMetrics;
use fixtures::{MockServer, TempDir, coordinator, num, worker, write_chat_recording};
use proto::v1;
use proto::v1::coordinator_client::CoordinatorClient;
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
}

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
        Lie::DoublePong | Lie::NoPong => {}
    }
    v1::Report {
        seq: 1,
        r#final: false,
        histograms,
        counters: Some(counters),
        ..Default::default()
    }
}

/// Join `addr` as `id`, play along until the start, send the lie, then keep heartbeating
/// until the coordinator goes away.
async fn hostile_worker(addr: String, id: &str, lie: Lie) {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("address")
        .connect()
        .await
        .expect("the coordinator answers");
    let mut client = CoordinatorClient::new(channel);
    let (out_tx, out_rx) = mpsc::channel::<v1::WorkerMessage>(64);
    let send = |msg| v1::WorkerMessage { msg: Some(msg) };
    out_tx
        .send(send(v1::worker_message::Msg::Hello(v1::Hello {
            protocol_version: proto::PROTOCOL_VERSION,
            worker_id: id.to_owned(),
            host: "hostile".into(),
            capacity: 0,
            token: String::new(),
            nonce: proto::auth::nonce(),
        })))
        .await
        .expect("hello");
    let mut inbound = client
        .join(ReceiverStream::new(out_rx))
        .await
        .expect("joined")
        .into_inner();
    let assignment = loop {
        match inbound
            .message()
            .await
            .expect("stream")
            .expect("message")
            .msg
        {
            Some(v1::coordinator_message::Msg::Assignment(a)) => break a,
            Some(_) => continue,
            None => panic!("empty message"),
        }
    };
    // Take the slice (and drop it) so the coordinator's feeder is not held up.
    let mut slice = client
        .exchanges(v1::SliceRequest {
            run_id: assignment.run_id.clone(),
            worker_id: id.to_owned(),
            token: assignment.slice_key.clone(),
        })
        .await
        .expect("slice")
        .into_inner();
    tokio::spawn(async move { while let Ok(Some(_)) = slice.message().await {} });
    let now_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as u64
    };
    loop {
        match inbound.message().await {
            Ok(Some(v1::CoordinatorMessage {
                msg: Some(v1::coordinator_message::Msg::ClockPing(ping)),
            })) => {
                let answers = match lie {
                    Lie::NoPong => 0,
                    Lie::DoublePong => 2,
                    _ => 1,
                };
                for _ in 0..answers {
                    let t = now_ns();
                    let _ = out_tx
                        .send(send(v1::worker_message::Msg::ClockPong(v1::ClockPong {
                            seq: ping.seq,
                            coordinator_send_unix_ns: ping.coordinator_send_unix_ns,
                            worker_receive_unix_ns: t,
                            worker_send_unix_ns: t,
                        })))
                        .await;
                }
            }
            Ok(Some(v1::CoordinatorMessage {
                msg: Some(v1::coordinator_message::Msg::Start(_)),
            })) => break,
            Ok(Some(_)) => {}
            _ => return,
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = out_tx
        .send(send(v1::worker_message::Msg::Report(lying_report(lie))))
        .await;
    loop {
        let heartbeat = send(v1::worker_message::Msg::Heartbeat(v1::Heartbeat {
            unix_ns: now_ns(),
        }));
        if out_tx.send(heartbeat).await.is_err() {
            return;
        }
        tokio::select! {
            message = inbound.message() => if !matches!(message, Ok(Some(_))) { return },
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
        ],
        2,
        &[],
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let liar = runtime.spawn(hostile_worker(addr.clone(), "liar", lie));
    // Let the liar join first, so it gets a share of the slice.
    std::thread::sleep(Duration::from_millis(300));
    let honest = worker(&addr, "honest", &[], &[]);
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
    let workers = report["run"]["workers"].as_array().expect("workers");
    let liar_row = workers
        .iter()
        .find(|w| w["id"] == "liar")
        .expect("the liar is listed");
    assert_eq!(liar_row["disconnected"], true, "{liar_row}");
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
fn counters_that_wrap_are_refused() {
    let _parallel = fixtures::parallel_lock();
    run_with_a_liar(Lie::Overflow);
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
                        nonce: proto::auth::nonce(),
                        proof: vec![7; 32],
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
    let double = runtime.spawn(hostile_worker(addr.clone(), "double", Lie::DoublePong));
    let mute = runtime.spawn(hostile_worker(addr.clone(), "mute", Lie::NoPong));
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
