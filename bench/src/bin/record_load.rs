//! `record-load`: the load and the upstream of the recording proxy's overhead benchmark
//! (`bench/run.py --rows record`, docs/performance.md "Recording proxy overhead").
//!
//! `record-load upstream` is a tiny HTTP/1.1 server of OpenAI chat completion streams: after
//! `--ttft` a role frame, then `--tokens` content frames `--itl` apart, then the finish frame,
//! the usage frame and `[DONE]`. Every frame is written on its own (chunked) and carries the
//! CLOCK_REALTIME nanosecond it was written at in its `system_fingerprint` (`"fp-<ns>"`), so a
//! client on the same machine can tell each frame's delivery delay with no clock alignment.
//!
//! `record-load client` drives `--rate` streamed requests a second for `--duration` over
//! `--connections` keep-alive HTTP/1.1 connections (hyper's `client::conn::http1`, one task a
//! connection, a current-thread runtime): request *i* is due at *i* ÷ rate and goes on
//! connection *i* mod C, as soon as that connection is free. Before the paced phase every
//! connection sends one warm-up request (connect included, not measured). It measures each
//! request's time to first byte (t0 just before the request is handed to hyper → the first
//! body chunk) and each frame's delivery delay (the read's CLOCK_REALTIME − the frame's
//! stamp; the clock is read when the read returns, before the bytes are looked at), and
//! prints one JSON summary line: counts, achieved rate, and their quantiles in microseconds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Parser)]
#[command(about = "Load and stamping upstream for the recording proxy's overhead benchmark")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve stamped OpenAI chat streams.
    Upstream(UpstreamArgs),
    /// Drive paced streamed requests and measure TTFB and per-frame delay.
    Client(ClientArgs),
}

#[derive(Debug, clap::Args)]
struct UpstreamArgs {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Milliseconds from the request to the first frame.
    #[arg(long, default_value_t = 5)]
    ttft_ms: u64,
    /// Microseconds between content frames.
    #[arg(long, default_value_t = 2000)]
    itl_us: u64,
    /// Content frames a response.
    #[arg(long, default_value_t = 16)]
    tokens: u64,
}

#[derive(Debug, clap::Args)]
struct ClientArgs {
    /// `http://HOST:PORT`.
    #[arg(long)]
    target: String,
    /// Requests a second.
    #[arg(long, default_value_t = 1200.0)]
    rate: f64,
    /// Seconds of paced load.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Keep-alive connections (each carries one request at a time).
    #[arg(long, default_value_t = 64)]
    connections: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match args.command {
        Command::Upstream(upstream) => runtime.block_on(serve(upstream)),
        Command::Client(client) => {
            let summary = runtime.block_on(drive(client))?;
            println!("{summary}");
            Ok(())
        }
    }
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Upstream

async fn serve(args: UpstreamArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen).await?;
    println!(
        "record-load upstream listening on http://{}",
        listener.local_addr()?
    );
    let shape = Arc::new(args);
    loop {
        let (socket, _) = listener.accept().await?;
        socket.set_nodelay(true)?;
        tokio::spawn(serve_connection(socket, Arc::clone(&shape)));
    }
}

/// Answer requests on one keep-alive connection until the peer closes it.
async fn serve_connection(mut socket: TcpStream, shape: Arc<UpstreamArgs>) {
    let mut pending = Vec::with_capacity(4096);
    let mut buf = vec![0u8; 8192];
    loop {
        // One request: the head and its content-length body.
        let consumed = loop {
            if let Some(len) = complete_request(&pending) {
                break len;
            }
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
        };
        pending.drain(..consumed);
        if respond(&mut socket, &shape).await.is_err() {
            return;
        }
    }
}

/// The length of the first whole request in `bytes` (head + content-length body), if there.
fn complete_request(bytes: &[u8]) -> Option<usize> {
    let head_end = memfind(bytes, b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&bytes[..head_end]).ok()?;
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    (bytes.len() >= head_end + length).then_some(head_end + length)
}

fn memfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";

/// One OpenAI chat completion chunk as an SSE event in one HTTP chunk, stamped now.
fn chunk_frame(out: &mut Vec<u8>, choices: &str, usage: &str) {
    let event = format!(
        "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1765000000,\"model\":\"bench-model\",\"system_fingerprint\":\"fp-{}\",\"choices\":[{choices}]{usage}}}\n\n",
        unix_ns()
    );
    out.extend_from_slice(format!("{:x}\r\n", event.len()).as_bytes());
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\r\n");
}

async fn respond(socket: &mut TcpStream, shape: &UpstreamArgs) -> std::io::Result<()> {
    let start = tokio::time::Instant::now();
    socket.write_all(HEAD).await?;
    let first = start + Duration::from_millis(shape.ttft_ms);
    tokio::time::sleep_until(first).await;
    let mut out = Vec::with_capacity(1024);
    chunk_frame(
        &mut out,
        r#"{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}"#,
        "",
    );
    socket.write_all(&out).await?;
    for i in 0..shape.tokens {
        tokio::time::sleep_until(first + Duration::from_micros(shape.itl_us * (i + 1))).await;
        out.clear();
        let choice = format!(
            r#"{{"index":0,"delta":{{"content":" word{i}"}},"logprobs":null,"finish_reason":null}}"#
        );
        chunk_frame(&mut out, &choice, "");
        socket.write_all(&out).await?;
    }
    out.clear();
    chunk_frame(
        &mut out,
        r#"{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}"#,
        "",
    );
    let usage = format!(
        r#","usage":{{"prompt_tokens":12,"completion_tokens":{},"total_tokens":{}}}"#,
        shape.tokens,
        shape.tokens + 12
    );
    chunk_frame(&mut out, "", &usage);
    out.extend_from_slice(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n");
    socket.write_all(&out).await
}

// ---------------------------------------------------------------------------------------------
// Client

/// What one connection's task measured.
#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    succeeded: u64,
    failed: u64,
    late: u64,
    frames: u64,
    ttfb_us: Vec<f64>,
    frame_delay_us: Vec<f64>,
    first_sent: Option<Instant>,
    last_done: Option<Instant>,
}

async fn drive(args: ClientArgs) -> anyhow::Result<serde_json::Value> {
    let authority = args
        .target
        .strip_prefix("http://")
        .context("--target must be http://HOST:PORT")?
        .trim_end_matches('/')
        .to_owned();
    anyhow::ensure!(
        args.rate > 0.0 && args.duration > 0.0 && args.connections > 0,
        "--rate, --duration and --connections must be positive"
    );
    let body = Bytes::from(
        serde_json::json!({
            "model": "bench-model",
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 16,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string(),
    );
    let total = (args.rate * args.duration).round() as u64;
    let connections = args.connections as u64;
    let warm = Arc::new(tokio::sync::Barrier::new(args.connections + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..connections {
        let (authority, body, warm) = (authority.clone(), body.clone(), Arc::clone(&warm));
        let rate = args.rate;
        tasks.spawn(async move {
            lane_run(lane, connections, total, rate, authority, body, warm).await
        });
    }
    warm.wait().await;
    let mut all = Tally::default();
    let mut warmup_failed = 0;
    while let Some(done) = tasks.join_next().await {
        let (warmup_ok, tally) = done.context("client task")?;
        warmup_failed += u64::from(!warmup_ok);
        merge(&mut all, tally);
    }
    let window = match (all.first_sent, all.last_done) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    Ok(serde_json::json!({
        "requests": all.sent,
        "succeeded": all.succeeded,
        "failed": all.failed,
        "warmup_requests": connections,
        "warmup_failed": warmup_failed,
        "late_starts": all.late,
        "frames": all.frames,
        "window_s": window,
        "achieved_rate": if window > 0.0 { all.succeeded as f64 / window } else { 0.0 },
        "ttfb_us": quantiles(&mut all.ttfb_us),
        "frame_delay_us": quantiles(&mut all.frame_delay_us),
    }))
}

fn merge(all: &mut Tally, tally: Tally) {
    all.sent += tally.sent;
    all.succeeded += tally.succeeded;
    all.failed += tally.failed;
    all.late += tally.late;
    all.frames += tally.frames;
    all.ttfb_us.extend(tally.ttfb_us);
    all.frame_delay_us.extend(tally.frame_delay_us);
    all.first_sent = min_option(all.first_sent, tally.first_sent);
    all.last_done = match (all.last_done, tally.last_done) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
}

fn min_option(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn quantiles(values: &mut [f64]) -> serde_json::Value {
    if values.is_empty() {
        return serde_json::Value::Null;
    }
    values.sort_by(f64::total_cmp);
    // Nearest rank, as bench/run.py's `quantile`.
    let at =
        |q: f64| values[((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1];
    serde_json::json!({
        "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "p999": at(0.999),
        "max": at(1.0), "count": values.len(),
    })
}

/// One connection: a warm-up request, the barrier, then requests lane, lane + C, … each at
/// its due instant (or at once when the previous one ran past it, counted as late).
async fn lane_run(
    lane: u64,
    connections: u64,
    total: u64,
    rate: f64,
    authority: String,
    body: Bytes,
    warm: Arc<tokio::sync::Barrier>,
) -> (bool, Tally) {
    let mut sender = None;
    let mut tally = Tally::default();
    let warmup_ok = exchange(&mut sender, &authority, &body, &mut Tally::default())
        .await
        .is_ok();
    warm.wait().await;
    let start = tokio::time::Instant::now();
    let mut index = lane;
    while index < total {
        let due = start + Duration::from_secs_f64(index as f64 / rate);
        if tokio::time::Instant::now() > due + Duration::from_millis(1) {
            tally.late += 1;
        }
        tokio::time::sleep_until(due).await;
        tally.first_sent.get_or_insert_with(Instant::now);
        tally.sent += 1;
        match exchange(&mut sender, &authority, &body, &mut tally).await {
            Ok(()) => tally.succeeded += 1,
            Err(_) => {
                tally.failed += 1;
                sender = None;
            }
        }
        tally.last_done = Some(Instant::now());
        index += connections;
    }
    (warmup_ok, tally)
}

async fn connect(authority: &str) -> anyhow::Result<http1::SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(authority).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

async fn exchange(
    sender: &mut Option<http1::SendRequest<Full<Bytes>>>,
    authority: &str,
    body: &Bytes,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    let send = match sender {
        Some(send) if !send.is_closed() => send,
        _ => sender.insert(connect(authority).await.context("connect")?),
    };
    send.ready().await.context("connection not ready")?;
    let request = http::Request::post("/v1/chat/completions")
        .header(http::header::HOST, authority)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body.clone()))?;
    let t0 = Instant::now();
    let response = send.send_request(request).await.context("send")?;
    anyhow::ensure!(response.status() == 200, "status {}", response.status());
    let mut body = response.into_body();
    let mut first = true;
    let mut done = false;
    while let Some(frame) = body.frame().await {
        // Clock first, then look at the bytes.
        let (at, now_ns) = (t0.elapsed(), unix_ns());
        let Ok(data) = frame.context("body")?.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        if first {
            tally.ttfb_us.push(at.as_secs_f64() * 1e6);
            first = false;
        }
        for stamp in stamps(&data) {
            tally.frames += 1;
            tally
                .frame_delay_us
                .push(now_ns.saturating_sub(stamp) as f64 / 1e3);
        }
        done |= memfind(&data, b"data: [DONE]").is_some();
    }
    anyhow::ensure!(done, "stream ended without [DONE]");
    Ok(())
}

/// The write stamps (`"system_fingerprint":"fp-<ns>"`) of the frames in one chunk.
fn stamps(data: &[u8]) -> impl Iterator<Item = u64> + '_ {
    const KEY: &[u8] = b"\"fp-";
    let mut rest = data;
    std::iter::from_fn(move || {
        let at = memfind(rest, KEY)? + KEY.len();
        let digits = rest[at..].iter().take_while(|b| b.is_ascii_digit()).count();
        let value = std::str::from_utf8(&rest[at..at + digits])
            .ok()?
            .parse()
            .ok();
        rest = &rest[at + digits..];
        value
    })
}
