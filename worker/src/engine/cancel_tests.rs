//! Cancellations (recorded and `--cancel-rate`) and `--tokenizer` counting, against a real
//! local server: a tiny HTTP/1.1 server that stamps when each request arrived and when its
//! connection was closed (the read that returned end of file), so what the client did is
//! measured by the other side of the socket.

use std::sync::Mutex;

use super::*;
use crate::config::LoadModel;

/// What the server does with each request.
#[derive(Clone)]
enum Script {
    /// Never answers (the client cancels before the head).
    Hold,
    /// An SSE stream: each frame after its delay from the previous one, then `[DONE]`.
    Stream {
        frames: Vec<(Duration, String)>,
        done: bool,
    },
}

/// What the server saw, in the order it saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Seen {
    /// A whole request arrived on connection `conn`.
    Request { conn: usize, at: Instant },
    /// Connection `conn` was closed by the client.
    Closed { conn: usize, at: Instant },
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Seen>>>);

impl Log {
    fn push(&self, seen: Seen) {
        self.0.lock().expect("the log lock").push(seen);
    }

    fn all(&self) -> Vec<Seen> {
        self.0.lock().expect("the log lock").clone()
    }

    fn request_at(&self, conn: usize) -> Option<Instant> {
        self.all().into_iter().find_map(|seen| match seen {
            Seen::Request { conn: c, at } if c == conn => Some(at),
            _ => None,
        })
    }

    fn closed_at(&self, conn: usize) -> Option<Instant> {
        self.all().into_iter().find_map(|seen| match seen {
            Seen::Closed { conn: c, at } if c == conn => Some(at),
            _ => None,
        })
    }

    /// Wait (bounded) until connection `conn` was seen closed.
    async fn wait_closed(&self, conn: usize) -> Instant {
        for _ in 0..500 {
            if let Some(at) = self.closed_at(conn) {
                return at;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("connection {conn} was never closed: {:?}", self.all());
    }

    fn connections(&self) -> usize {
        self.all()
            .iter()
            .filter_map(|seen| match seen {
                Seen::Request { conn, .. } => Some(*conn + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }
}

/// A server-side instant on the client's wall clock, in Unix microseconds (both sides are
/// this process, so one reference pair converts within a microsecond).
struct UnixClock {
    instant: Instant,
    unix_us: u64,
}

impl UnixClock {
    fn now() -> UnixClock {
        let unix_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_micros() as u64;
        UnixClock {
            instant: Instant::now(),
            unix_us,
        }
    }

    fn unix_us(&self, at: Instant) -> i64 {
        if at >= self.instant {
            self.unix_us as i64 + at.duration_since(self.instant).as_micros() as i64
        } else {
            self.unix_us as i64 - self.instant.duration_since(at).as_micros() as i64
        }
    }
}

/// How long after the client's t0 (`sent_unix_us`, where its cancel timer starts) the server
/// saw connection `conn` closed, in microseconds. Measured from the client's own reference,
/// not from the server's arrival stamp, which a loaded machine delays by however long the
/// server's reader waited for a core.
async fn closed_after_t0_us(
    log: &Log,
    conn: usize,
    outcome: &RequestOutcome,
    clock: &UnixClock,
) -> i64 {
    let closed = log.wait_closed(conn).await;
    let sent = outcome
        .sent_unix_us
        .expect("the cancelled request has a t0") as i64;
    clock.unix_us(closed) - sent
}

/// A local server playing `script` for every request; its URL and its log.
async fn scripted_server(script: Script) -> (String, Log) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let log = Log::default();
    let server_log = log.clone();
    tokio::spawn(async move {
        let mut next_conn = 0usize;
        while let Ok((stream, _)) = listener.accept().await {
            let conn = next_conn;
            next_conn += 1;
            let script = script.clone();
            let (mut read, mut write) = stream.into_split();
            let (requests_tx, mut requests) = mpsc::unbounded_channel::<()>();
            let reader_log = server_log.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                loop {
                    let head_end = buffer
                        .windows(4)
                        .position(|w| w == b"\r\n\r\n")
                        .map(|at| at + 4);
                    if let Some(head_end) = head_end {
                        let head =
                            String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|line| line.strip_prefix("content-length:"))
                            .and_then(|value| value.trim().parse().ok())
                            .unwrap_or(0);
                        if buffer.len() >= head_end + length {
                            buffer.drain(..head_end + length);
                            reader_log.push(Seen::Request {
                                conn,
                                at: Instant::now(),
                            });
                            let _ = requests_tx.send(());
                            continue;
                        }
                    }
                    let mut chunk = [0u8; 4096];
                    match read.read(&mut chunk).await {
                        Ok(0) | Err(_) => {
                            reader_log.push(Seen::Closed {
                                conn,
                                at: Instant::now(),
                            });
                            return;
                        }
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                }
            });
            tokio::spawn(async move {
                while requests.recv().await.is_some() {
                    let Script::Stream { frames, done } = &script else {
                        continue;
                    };
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                    if write.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
                    for (delay, text) in frames {
                        tokio::time::sleep(*delay).await;
                        let frame = format!(
                            "data: {}\n\n",
                            serde_json::json!({"choices":[{"index":0,"delta":{"content":text}}]})
                        );
                        if write.write_all(chunk(&frame).as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    if *done
                        && write
                            .write_all(format!("{}0\r\n\r\n", chunk("data: [DONE]\n\n")).as_bytes())
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (url, log)
}

fn config_for(target: String, tokenizer: Option<Arc<crate::tokens::Tokenizer>>) -> ReplayConfig {
    ReplayConfig {
        target,
        load: LoadModel {
            schedule: Schedule::Asap,
            concurrency: Some(1),
            rate: None,
            arrival: Arrival::Constant,
            duration: None,
            warmup: 0,
            seed: 0,
        },
        headers: vec![],
        sets: vec![],
        tag_requests: false,
        transport: crate::config::TransportConfig::default(),
        tokenizer,
        options: common::assignment::RequestOptions {
            timeout: Duration::from_secs(10),
            ..Default::default()
        },
    }
}

const CHAT_BODY: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hello hello world foo"}]}"#;

fn item(index: u64) -> WorkItem {
    let exchange = serde_json::from_value(serde_json::json!({
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": CHAT_BODY}
    }))
    .expect("a valid exchange");
    WorkItem {
        index,
        exchange,
        pin_output_tokens: None,
        pin_in_frames: false,
        cancel_after: None,
        think: None,
        reassigned: false,
    }
}

/// Send one request as a stream task does, cancelled per `cancel`, and count what is missing.
async fn send(
    config: &ReplayConfig,
    client: &TargetClient,
    cancel: Option<Cancel>,
    pacer: Option<&Pacer>,
) -> RequestOutcome {
    let mut work = item(0);
    let request = prepare(&mut work, config);
    let body = request.body.clone();
    let Measured { outcome, text, .. } = send_one(
        config,
        client,
        "/v1/chat/completions",
        request,
        None,
        cancel,
        pacer,
    )
    .await;
    crate::tokens::count_missing(
        config.tokenizer.as_ref(),
        outcome,
        crate::tokens::ToCount {
            text,
            path: "/v1/chat/completions".into(),
            body,
        },
    )
    .await
}

fn word_tokenizer() -> Arc<crate::tokens::Tokenizer> {
    // A whitespace word-level tokenizer: "hello world hello" is three tokens.
    let json = br#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,"model":{"type":"WordLevel","vocab":{"hello":0,"world":1,"[UNK]":2},"unk_token":"[UNK]"}}"#;
    Arc::new(crate::tokens::Tokenizer::from_parts(json, None, "words.json").expect("a tokenizer"))
}

fn stream_of(texts: &[&str], gap: Duration) -> Script {
    Script::Stream {
        frames: texts.iter().map(|t| (gap, (*t).to_owned())).collect(),
        done: true,
    }
}

#[tokio::test]
async fn a_stream_without_usage_is_counted_by_the_tokenizer() {
    let (url, _log) = scripted_server(stream_of(
        &["hello world", " hello"],
        Duration::from_millis(1),
    ))
    .await;
    let client = TargetClient::new(&crate::config::TransportConfig::default()).expect("client");

    let config = config_for(url.clone(), Some(word_tokenizer()));
    let outcome = send(&config, &client, None, None).await;
    assert_eq!(outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(outcome.content_frames, 2);
    assert_eq!(outcome.usage_output_tokens, None);
    assert_eq!(outcome.tokenized_output_tokens, Some(3));
    assert_eq!(outcome.output_tokens(), 3);
    assert_eq!(
        outcome.output_source(),
        common::measure::TokenSource::Tokenizer
    );
    // The prompt "hello hello world foo" (no chat template): four tokens.
    assert_eq!(outcome.input_tokens, Some(4));
    assert_eq!(
        outcome.input_source,
        Some(common::measure::TokenSource::Tokenizer)
    );

    // Without a tokenizer: one token a content frame, and the prompt estimated.
    let config = config_for(url, None);
    let outcome = send(&config, &client, None, None).await;
    assert_eq!(outcome.tokenized_output_tokens, None);
    assert_eq!(outcome.output_tokens(), 2);
    assert_eq!(
        outcome.output_source(),
        common::measure::TokenSource::Frames
    );
    assert_eq!(
        outcome.input_source,
        Some(common::measure::TokenSource::Estimate)
    );
    assert!(outcome.input_tokens.is_some());
}

#[tokio::test]
async fn a_cancel_before_the_head_closes_the_connection_and_has_no_ttft() {
    let (url, log) = scripted_server(Script::Hold).await;
    let client = TargetClient::new(&crate::config::TransportConfig::default()).expect("client");
    let config = config_for(url, None);
    let mut pacer_thread = PacerThread::start().expect("a pacer thread");
    let pacer = pacer_thread.pacer();
    let after = Duration::from_millis(40);
    let clock = UnixClock::now();
    let outcome = send(
        &config,
        &client,
        Some(Cancel {
            after,
            cause: CancelCause::AsRecorded,
        }),
        Some(&pacer),
    )
    .await;
    assert_eq!(
        outcome.kind,
        OutcomeKind::Cancelled(CancelCause::AsRecorded)
    );
    assert_eq!(outcome.ttft_us, None);
    assert_eq!(outcome.latency_us, None);
    assert_eq!(outcome.content_frames, 0);
    assert!(outcome.sent_unix_us.is_some());
    assert!(log.request_at(0).is_some(), "the request arrived");
    // Never early: the server sees the close no sooner than `after` past the client's t0.
    let seen_us = closed_after_t0_us(&log, 0, &outcome, &clock).await;
    assert!(
        seen_us >= after.as_micros() as i64 - 1,
        "closed {seen_us} µs after t0"
    );
    pacer_thread.stop();
}

#[tokio::test]
async fn a_cancel_mid_stream_keeps_the_ttft_and_never_reuses_the_connection() {
    let (url, log) = scripted_server(stream_of(
        &["hello", " world", " hello", " world", " hello", " world"],
        Duration::from_millis(20),
    ))
    .await;
    let client = TargetClient::new(&crate::config::TransportConfig::default()).expect("client");
    let config = config_for(url, Some(word_tokenizer()));
    let mut pacer_thread = PacerThread::start().expect("a pacer thread");
    let pacer = pacer_thread.pacer();
    let outcome = send(
        &config,
        &client,
        Some(Cancel {
            after: Duration::from_millis(50),
            cause: CancelCause::ByRate,
        }),
        Some(&pacer),
    )
    .await;
    assert_eq!(outcome.kind, OutcomeKind::Cancelled(CancelCause::ByRate));
    let ttft = outcome
        .ttft_us
        .expect("the first token came before the cancel");
    assert!((15_000..50_000).contains(&ttft), "{ttft}");
    assert!(
        (1..=2).contains(&outcome.content_frames),
        "{}",
        outcome.content_frames
    );
    assert_eq!(outcome.latency_us, None);
    log.wait_closed(0).await;

    // The next request goes on a new connection: the cancelled one was closed, not pooled.
    let outcome = send(&config, &client, None, Some(&pacer)).await;
    assert_eq!(outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(log.connections(), 2);

    // An answer that ends before its cancel point is an ordinary outcome.
    let outcome = send(
        &config,
        &client,
        Some(Cancel {
            after: Duration::from_secs(5),
            cause: CancelCause::AsRecorded,
        }),
        Some(&pacer),
    )
    .await;
    assert_eq!(outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(outcome.tokenized_output_tokens, Some(6));
    pacer_thread.stop();
}

/// The cancel reaches the server within 2 ms of the recorded point: measured as the server
/// sees it (the client's t0 to the end of file on the server's side of the connection),
/// before the head and mid stream. The achieved error is printed (`--nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_reach_the_server_at_the_recorded_point() {
    let client = TargetClient::new(&crate::config::TransportConfig::default()).expect("client");
    let mut pacer_thread = PacerThread::start().expect("a pacer thread");
    let pacer = pacer_thread.pacer();
    let mut errors_us: Vec<i64> = Vec::new();
    let clock = UnixClock::now();
    for (case, script) in [
        ("before the head", Script::Hold),
        (
            "mid-stream",
            stream_of(&["hello"; 40], Duration::from_millis(3)),
        ),
    ] {
        let (url, log) = scripted_server(script).await;
        let config = config_for(url, None);
        let mut case_errors = Vec::new();
        for round in 0..20u64 {
            // Not a whole number of milliseconds: tokio's timer would round it up.
            let after = Duration::from_micros(20_000 + 350 * round);
            let outcome = send(
                &config,
                &client,
                Some(Cancel {
                    after,
                    cause: CancelCause::AsRecorded,
                }),
                Some(&pacer),
            )
            .await;
            assert!(matches!(outcome.kind, OutcomeKind::Cancelled(_)), "{case}");
            let seen = closed_after_t0_us(&log, round as usize, &outcome, &clock).await;
            case_errors.push(seen - after.as_micros() as i64);
        }
        case_errors.sort_unstable();
        eprintln!(
            "cancel error {case} (server-seen - recorded, µs): min {} p50 {} p90 {} max {}",
            case_errors[0],
            case_errors[case_errors.len() / 2],
            case_errors[case_errors.len() * 9 / 10],
            case_errors[case_errors.len() - 1]
        );
        errors_us.extend(case_errors);
    }
    errors_us.sort_unstable();
    let p90 = errors_us[errors_us.len() * 9 / 10];
    assert!(p90.abs() < 2_000, "p90 error {p90} µs: {errors_us:?}");
    pacer_thread.stop();
}

#[tokio::test]
async fn a_cancel_rate_of_half_cancels_about_half_and_the_same_ones_for_a_seed() {
    async fn run_once(seed: u64) -> (common::metrics::Counters, u64) {
        let (url, _log) =
            scripted_server(stream_of(&["hello", " world"], Duration::from_millis(5))).await;
        let mut config = config_for(url, None);
        config.load.concurrency = Some(8);
        config.options.cancel = common::assignment::CancelOptions {
            rate_pct: 50.0,
            after: Duration::ZERO,
            seed,
        };
        let (items_tx, items) = mpsc::channel(256);
        for index in 0..200 {
            items_tx.send(item(index)).await.expect("open");
        }
        drop(items_tx);
        let metrics =
            MetricsHandle::spawn(crate::metrics_actor::Judging::from_options(&config.options));
        let (_abort_tx, abort) = watch::channel(false);
        let config = Arc::new(config);
        let run = EngineRun {
            config: Arc::clone(&config),
            client: TargetClient::new(&crate::config::TransportConfig::default()).expect("client"),
            items,
            start: StartAt {
                instant: Instant::now(),
            },
            metrics: metrics.clone(),
            abort,
            open_ended: false,
            counters: Arc::default(),
            claims: None,
        };
        let totals = tokio::time::timeout(Duration::from_secs(60), replay(run))
            .await
            .expect("the replay ends");
        assert_eq!(totals.issued, 200);
        let snapshot = metrics.snapshot().await;
        let drawn = (0..200).filter(|i| config.options.cancel.draws(*i)).count() as u64;
        (snapshot.metrics.counters, drawn)
    }
    let (first, drawn) = run_once(11).await;
    assert_eq!(first.cancelled_by_rate, drawn, "{first:?}");
    assert!((70..=130).contains(&drawn), "{drawn}");
    assert_eq!(first.cancelled_as_recorded, 0);
    assert_eq!(first.succeeded + first.cancelled_by_rate, 200, "{first:?}");
    let (again, _) = run_once(11).await;
    assert_eq!(again.cancelled_by_rate, first.cancelled_by_rate);
}

/// What `--tokenizer` costs per token, on a real tokenizer (tests/data/tokenizer.json):
/// printed (`--nocapture`), asserted only to be counted.
#[test]
fn tokenizer_cost_per_token() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer.json");
    let tokenizer = crate::tokens::Tokenizer::from_file(&path).expect("the test tokenizer");
    let text = "The quick brown fox jumps over the lazy dog, and then it explains, step by step, why tokenizers split words into pieces. ".repeat(200);
    let started = Instant::now();
    let rounds = 20;
    let mut tokens = 0;
    for _ in 0..rounds {
        tokens += tokenizer.count_text(&text);
    }
    let per_token_ns = started.elapsed().as_nanos() as f64 / tokens as f64;
    eprintln!(
        "tokenizer: {tokens} tokens, {per_token_ns:.0} ns a token (repeated text: cached chunks)"
    );
    let unique: String = (0..4000).map(|i| format!("w{i}x{} ", i * 7)).collect();
    let started = Instant::now();
    let cold_tokens = tokenizer.count_text(&unique);
    let cold_ns = started.elapsed().as_nanos() as f64 / cold_tokens as f64;
    eprintln!(
        "tokenizer: {cold_tokens} tokens of unique words, {cold_ns:.0} ns a token (uncached)"
    );
    assert!(tokens > 0 && cold_tokens > 0);
}
