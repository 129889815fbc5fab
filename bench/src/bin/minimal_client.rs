//! `minimal-client`: the practical limit of a streaming LLM client, to compare llm-replay with.
//!
//! Closed loop at `--concurrency C` over `--requests N`: C tasks, each with its own HTTP/1.1
//! connection (`hyper::client::conn::http1`, no pool, no TLS, `TCP_NODELAY`), take the next
//! request index, send one streaming chat completion tagged `x-llm-replay-exchange: <index>`
//! (so it joins the mock's `--write-log`), and time it: t0 just before the request is handed
//! to hyper (the first request of a connection includes its connect, as a client without
//! warm-up would), TTFT at the first body chunk that carries content (a non-empty
//! `"content":"…"`, so the empty role chunk does not count, as in llm-replay and AIPerf),
//! latency at the end of the body. The clock is read when the read returns, before the chunk
//! is looked at. Output tokens are the usage's
//! `completion_tokens` when the stream reports it, else the count of `data:` events.
//!
//! Writes one JSON line per request to `--out` and a one-line JSON summary to stdout.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The header the mock's truth log and llm-replay's `--tag-requests` use.
const EXCHANGE_HEADER: &str = "x-llm-replay-exchange";

#[derive(Debug, Parser)]
#[command(about = "Minimal hyper streaming client: closed loop, per-request TTFT as JSON lines")]
struct Args {
    /// Server address, `http://HOST:PORT` (cleartext HTTP/1.1 only).
    #[arg(long)]
    target: String,
    /// Request path.
    #[arg(long, default_value = "/v1/chat/completions")]
    path: String,
    /// Requests in flight (one connection each).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Requests in all.
    #[arg(long, default_value_t = 1000)]
    requests: u64,
    /// `max_tokens` of each request.
    #[arg(long, default_value_t = 16)]
    max_tokens: u64,
    /// Per-request JSON lines.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Runtime threads (1 = a current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// One measured request.
#[derive(Debug, Clone, Default)]
struct Measured {
    index: u64,
    status: u16,
    error: Option<String>,
    sent_unix_ns: u64,
    ttft_ns: Option<u64>,
    latency_ns: Option<u64>,
    chunks: u64,
    output_tokens: u64,
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let authority = args
        .target
        .strip_prefix("http://")
        .context("--target must be http://HOST:PORT")?
        .trim_end_matches('/')
        .to_owned();
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()?
    };
    let body = Bytes::from(
        serde_json::json!({
            "model": "mock-model",
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": args.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string(),
    );
    let started = Instant::now();
    let records = runtime.block_on(run(&args, authority, body))?;
    let elapsed = started.elapsed().as_secs_f64();

    let ok = records
        .iter()
        .filter(|r| r.status == 200 && r.error.is_none());
    let (ok_count, tokens) = ok.fold((0u64, 0u64), |(n, t), r| (n + 1, t + r.output_tokens));
    if let Some(path) = &args.out {
        let file = std::fs::File::create(path).with_context(|| format!("{}", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        for r in &records {
            let line = serde_json::json!({
                "index": r.index,
                "status": r.status,
                "error": r.error,
                "sent_unix_ns": r.sent_unix_ns,
                "first_chunk_unix_ns": r.ttft_ns.map(|t| r.sent_unix_ns + t),
                "ttft_ms": r.ttft_ns.map(|t| t as f64 / 1e6),
                "latency_ms": r.latency_ns.map(|t| t as f64 / 1e6),
                "chunks": r.chunks,
                "output_tokens": r.output_tokens,
            });
            serde_json::to_writer(&mut out, &line)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
    }
    let summary = serde_json::json!({
        "requests": records.len(),
        "succeeded": ok_count,
        "output_tokens": tokens,
        "elapsed_s": elapsed,
        "output_tokens_per_s": tokens as f64 / elapsed,
    });
    println!("{summary}");
    Ok(())
}

async fn run(args: &Args, authority: String, body: Bytes) -> anyhow::Result<Vec<Measured>> {
    let next = Arc::new(AtomicU64::new(0));
    let authority = Arc::new(authority);
    let path = Arc::new(args.path.clone());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency.max(1) {
        let next = Arc::clone(&next);
        let authority = Arc::clone(&authority);
        let path = Arc::clone(&path);
        let body = body.clone();
        let total = args.requests;
        tasks.spawn(async move {
            let mut records = Vec::new();
            let mut sender: Option<http1::SendRequest<Full<Bytes>>> = None;
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= total {
                    break;
                }
                let record = one_request(&mut sender, &authority, &path, &body, index).await;
                if record.error.is_some() {
                    sender = None;
                }
                records.push(record);
            }
            records
        });
    }
    let mut all = Vec::with_capacity(args.requests as usize);
    while let Some(done) = tasks.join_next().await {
        all.extend(done.context("client task")?);
    }
    all.sort_by_key(|r| r.index);
    Ok(all)
}

async fn connect(authority: &str) -> anyhow::Result<http1::SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(authority).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        // The connection ends when the sender is dropped or the server closes it.
        let _ = connection.await;
    });
    Ok(sender)
}

async fn one_request(
    sender: &mut Option<http1::SendRequest<Full<Bytes>>>,
    authority: &str,
    path: &str,
    body: &Bytes,
    index: u64,
) -> Measured {
    let mut record = Measured {
        index,
        sent_unix_ns: unix_ns(),
        ..Measured::default()
    };
    let t0 = Instant::now();
    if let Err(error) = exchange(sender, authority, path, body, index, t0, &mut record).await {
        record.error = Some(format!("{error:#}"));
    }
    record
}

async fn exchange(
    sender: &mut Option<http1::SendRequest<Full<Bytes>>>,
    authority: &str,
    path: &str,
    body: &Bytes,
    index: u64,
    t0: Instant,
    record: &mut Measured,
) -> anyhow::Result<()> {
    let send = match sender {
        Some(send) if !send.is_closed() => send,
        _ => sender.insert(connect(authority).await.context("connect")?),
    };
    send.ready().await.context("connection not ready")?;
    let request = http::Request::post(path)
        .header(http::header::HOST, authority)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT_ENCODING, "identity")
        .header(EXCHANGE_HEADER, index)
        .body(Full::new(body.clone()))?;
    let response = send.send_request(request).await.context("send")?;
    record.status = response.status().as_u16();
    let mut body = response.into_body();
    let mut events = 0u64;
    let mut usage_tokens = None;
    while let Some(frame) = body.frame().await {
        // Clock first, then look at the bytes.
        let at = t0.elapsed().as_nanos() as u64;
        let frame = frame.context("body")?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        if record.ttft_ns.is_none() && has_content(&data) {
            record.ttft_ns = Some(at);
        }
        record.chunks += 1;
        events += count(&data, b"data: ");
        if let Some(tokens) = completion_tokens(&data) {
            usage_tokens = Some(tokens);
        }
    }
    record.latency_ns = Some(t0.elapsed().as_nanos() as u64);
    // Without usage: every event but `[DONE]` carried (at most) one token.
    record.output_tokens = usage_tokens.unwrap_or_else(|| events.saturating_sub(1));
    Ok(())
}

/// The chunk carries a non-empty `"content":"…"` (OpenAI chat delta).
fn has_content(data: &[u8]) -> bool {
    const KEY: &[u8] = b"\"content\":\"";
    data.windows(KEY.len() + 1)
        .any(|w| &w[..KEY.len()] == KEY && w[KEY.len()] != b'"')
}

fn count(haystack: &[u8], needle: &[u8]) -> u64 {
    haystack
        .windows(needle.len())
        .filter(|window| *window == needle)
        .count() as u64
}

/// The number after `"completion_tokens":` in this chunk, if any.
fn completion_tokens(data: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"completion_tokens\":";
    let at = data.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let digits: Vec<u8> = data[at..]
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}
