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
            token: String::new(),
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
    run_with_a_liar(Lie::HistogramBomb);
}

#[test]
fn a_worker_claiming_more_than_it_was_sent_is_dropped() {
    run_with_a_liar(Lie::TooManySuccesses);
}

#[test]
fn counters_that_wrap_are_refused() {
    run_with_a_liar(Lie::Overflow);
}
