//! The engine replays handed-over exchanges at their recorded pace, measured by the other side
//! of the socket: a tiny HTTP/1.1 server that stamps when each tagged request arrived.

use std::sync::Mutex;

use super::*;
use crate::config::LoadModel;

/// When each request arrived, by its exchange tag.
#[derive(Clone, Default)]
struct Arrivals(Arc<Mutex<Vec<(u64, SystemTime)>>>);

impl Arrivals {
    fn of(&self, index: u64) -> Option<SystemTime> {
        let seen = self.0.lock().expect("the arrivals lock");
        seen.iter().find(|(i, _)| *i == index).map(|(_, at)| *at)
    }
}

/// A local server answering every request with one chat body, stamping its arrival.
async fn stamping_server() -> (String, Arrivals) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let arrivals = Arrivals::default();
    let log = arrivals.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                loop {
                    let head_end = loop {
                        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let arrived = SystemTime::now();
                    let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
                    let header = |name: &str| {
                        head.lines()
                            .find_map(|line| line.strip_prefix(name))
                            .map(|value| value.trim().to_owned())
                    };
                    let length: usize = header("content-length:")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    if let Some(index) =
                        header("x-llm-replay-exchange:").and_then(|v| v.parse().ok())
                    {
                        log.0
                            .lock()
                            .expect("the arrivals lock")
                            .push((index, arrived));
                    }
                    while buffer.len() < head_end + length {
                        let mut chunk = [0u8; 4096];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buffer.drain(..head_end + length);
                    let body = r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, arrivals)
}

fn item(index: u64, at_ms: f64, reassigned: bool) -> WorkItem {
    let exchange = serde_json::from_value(serde_json::json!({
        "at_ms": at_ms,
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#}
    }))
    .expect("a valid exchange");
    WorkItem {
        index,
        exchange,
        pin_output_tokens: None,
        pin_in_frames: false,
        cancel_after: None,
        think: None,
        reassigned,
    }
}

fn unix_us(t: SystemTime) -> u64 {
    unix_nanos(t) / 1000
}

/// Twenty exchanges recorded 20 ms apart (at 0–380 ms) handed over 400 ms into the replay,
/// all at once: the first is late by 400 ms and sets the delay, and each then reaches the
/// server no earlier than its recorded spacing after the hand-over (before, all twenty went
/// at once). The survivor's own exchanges (one every 50 ms) keep their time, none is counted
/// out of order, and the live counters hold the hand-over's span. Only lower bounds on time
/// are asserted: a loaded machine sends late, never early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handed_over_exchanges_are_sent_at_their_recorded_spacing() {
    let (target, arrivals) = stamping_server().await;
    let config = ReplayConfig {
        target,
        load: LoadModel {
            schedule: Schedule::Recorded { speed: 1.0 },
            concurrency: None,
            rate: None,
            arrival: Arrival::Constant,
            duration: None,
            warmup: 0,
            seed: 0,
        },
        headers: vec![],
        sets: vec![],
        tag_requests: true,
        transport: crate::config::TransportConfig::default(),
        tokenizer: None,
        options: common::assignment::RequestOptions {
            timeout: Duration::from_secs(10),
            reorder_window: 64,
            ..Default::default()
        },
    };
    let (items_tx, items) = mpsc::channel(64);
    for own in 0..12u64 {
        items_tx
            .send(item(own, own as f64 * 50.0, false))
            .await
            .expect("open");
    }
    let start = Instant::now();
    let start_unix = SystemTime::now();
    let counters = Arc::new(LiveCounters::default());
    let (_abort_tx, abort) = watch::channel(false);
    let run = EngineRun {
        config: Arc::new(config),
        client: TargetClient::new(&crate::config::TransportConfig::default())
            .expect("a plain client"),
        items,
        start: StartAt { instant: start },
        metrics: MetricsHandle::spawn(Default::default()),
        abort,
        open_ended: false,
        counters: Arc::clone(&counters),
        claims: None,
    };
    let replay = tokio::spawn(replay(run));

    tokio::time::sleep_until((start + Duration::from_millis(400)).into()).await;
    let handed_over_at = SystemTime::now();
    let handed_over: Vec<(u64, f64)> = (0..20u64).map(|i| (100 + i, i as f64 * 20.0)).collect();
    for &(index, at_ms) in &handed_over {
        items_tx.send(item(index, at_ms, true)).await.expect("open");
    }
    drop(items_tx);
    let totals = tokio::time::timeout(Duration::from_secs(60), replay)
        .await
        .expect("the replay ends")
        .expect("the replay did not panic");
    assert_eq!(totals.issued, 32);
    assert_eq!(
        totals.sent_out_of_order, 0,
        "handed over is not out of order"
    );

    for &(index, at_ms) in &handed_over {
        let arrived = arrivals
            .of(index)
            .unwrap_or_else(|| panic!("exchange {index} reached the server"));
        let earliest = handed_over_at + Duration::from_secs_f64(at_ms / 1000.0);
        assert!(
            arrived >= earliest,
            "exchange {index} (recorded at {at_ms} ms) arrived {:?} before its recorded spacing \
             after the hand-over allowed",
            earliest.duration_since(arrived).unwrap_or_default()
        );
    }
    for own in 0..12u64 {
        let arrived = arrivals
            .of(own)
            .expect("an own exchange reached the server");
        let due = unix_us(start_unix) + own * 50_000;
        assert!(
            unix_us(arrived) + 1_000 >= due,
            "own exchange {own} went early"
        );
    }

    let span = counters.hand_over.span().expect("a hand-over was sent");
    assert_eq!((span.hand_overs, span.exchanges), (1, 20), "{span:?}");
    assert!(span.delay_us >= 400_000, "{span:?}");
    assert!(
        span.first_sent_unix_us >= unix_us(handed_over_at),
        "{span:?}"
    );
    assert!(
        span.last_sent_unix_us >= unix_us(handed_over_at) + 380_000,
        "{span:?}"
    );
}
