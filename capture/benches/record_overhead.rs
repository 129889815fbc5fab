//! Added latency per frame of `llm-replay record`: one upstream writes SSE frames that carry
//! their own send instant; a client reads them directly and through the recording proxy,
//! and the per-frame delivery delays (receive − send, one process, one clock) are compared.
//!
//! `cargo bench -p llm-replay-capture --bench record_overhead [-- STREAMS FRAMES GAP_US]`
//!
//! The proxy under production-like load (1,200 streamed requests a second through the
//! release binary as a process of its own, writing rotated gzip files, with its CPU, peak
//! memory and the recording checked) is `bench/run.py --rows record`; docs/performance.md,
//! "Recording proxy overhead".

use std::time::{Duration, Instant};

use capture::proxy::Upstream;
use capture::routes::Routes;
use capture::writer::Scrub;
use capture::{RecordConfig, run};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let number =
        |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (streams, frames, gap_us) = (number(0, 1), number(1, 2000), number(2, 1000));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(bench(streams as usize, frames as usize, gap_us));
}

async fn bench(streams: usize, frames: usize, gap_us: u64) {
    let epoch = Instant::now();
    let upstream = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let upstream_addr = upstream.local_addr().expect("addr");
    tokio::spawn(serve_upstream(upstream, epoch, frames, gap_us));

    let out = std::env::temp_dir().join(format!("llm-replay-bench-{}.jsonl", std::process::id()));
    let proxy = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
    let proxy_addr = proxy.local_addr().expect("addr");
    let config = RecordConfig {
        routes: Routes::single(Upstream::parse(&format!("http://{upstream_addr}")).expect("url")),
        out: out.clone(),
        scrub: Scrub::default(),
        session_header: None,
        upstream_h2c: false,
        upstream_ca: None,
        drain: Duration::from_secs(5),
        max_recorded_bytes: capture::DEFAULT_MAX_RECORDED_BYTES,
        upstream_idle_timeout: capture::DEFAULT_UPSTREAM_IDLE_TIMEOUT,
        health: Default::default(),
        recording: Default::default(),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let proxy_task = tokio::spawn(run(proxy, config, async {
        let _ = stop_rx.await;
    }));

    // Warm up both paths, then measure direct and proxied alternately.
    let _ = measure(upstream_addr, epoch, 1).await;
    let _ = measure(proxy_addr, epoch, 1).await;
    let mut direct = Vec::new();
    let mut proxied = Vec::new();
    for _ in 0..3 {
        direct.extend(measure(upstream_addr, epoch, streams).await);
        proxied.extend(measure(proxy_addr, epoch, streams).await);
    }
    let _ = stop_tx.send(());
    let summary = proxy_task.await.expect("proxy task").expect("proxy ran");
    let _ = std::fs::remove_file(&out);

    let (d, p) = (percentiles(&mut direct), percentiles(&mut proxied));
    println!(
        "record overhead: {streams} concurrent stream(s) x {frames} frames, {gap_us} us apart, 3 rounds; {} exchanges recorded",
        summary.written
    );
    println!("              p50 us   p90 us   p99 us   max us   frames");
    println!(
        "direct      {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8}",
        d[0],
        d[1],
        d[2],
        d[3],
        direct.len()
    );
    println!(
        "via record  {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8}",
        p[0],
        p[1],
        p[2],
        p[3],
        proxied.len()
    );
    println!(
        "added       {:>8.1} {:>8.1} {:>8.1}",
        p[0] - d[0],
        p[1] - d[1],
        p[2] - d[2]
    );
}

fn percentiles(values: &mut [f64]) -> [f64; 4] {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    [at(0.5), at(0.9), at(0.99), at(1.0)]
}

/// Run `streams` concurrent requests against `addr`; return every frame's delivery delay (µs).
async fn measure(addr: std::net::SocketAddr, epoch: Instant, streams: usize) -> Vec<f64> {
    let tasks: Vec<_> = (0..streams)
        .map(|_| tokio::spawn(one_stream(addr, epoch)))
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.extend(task.await.expect("stream task"));
    }
    out
}

async fn one_stream(addr: std::net::SocketAddr, epoch: Instant) -> Vec<f64> {
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    socket.set_nodelay(true).expect("nodelay");
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.expect("send");
    let mut delays = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = socket.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        let now = epoch.elapsed().as_nanos() as f64;
        pending.extend_from_slice(&buf[..n]);
        // Frames are `data: {"t":NANOS}\n\n`; chunk-size lines never contain `{"t":`.
        while let Some(start) = find(&pending, b"{\"t\":") {
            let Some(end) = find(&pending[start..], b"}") else {
                break;
            };
            let text = std::str::from_utf8(&pending[start + 5..start + end]).unwrap_or("0");
            if let Ok(sent) = text.parse::<f64>() {
                delays.push((now - sent) / 1000.0);
            }
            pending.drain(..start + end + 1);
        }
        if find(&pending, b"[DONE]").is_some() {
            break;
        }
    }
    delays
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A minimal HTTP/1.1 upstream: each request gets `frames` SSE frames, `gap_us` apart, in
/// chunked encoding, each carrying the instant it was written.
async fn serve_upstream(listener: TcpListener, epoch: Instant, frames: usize, gap_us: u64) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let _ = socket.set_nodelay(true);
        tokio::spawn(async move {
            let mut request = Vec::new();
            let mut buf = vec![0u8; 8192];
            // Read the head and the content-length body.
            loop {
                let n = socket.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                request.extend_from_slice(&buf[..n]);
                if let Some(head_end) = find(&request, b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&request[..head_end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if request.len() >= head_end + 4 + length {
                        break;
                    }
                }
            }
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            if socket.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let start = tokio::time::Instant::now();
            for i in 0..frames {
                tokio::time::sleep_until(start + Duration::from_micros(gap_us * i as u64)).await;
                let data = format!("data: {{\"t\":{}}}\n\n", epoch.elapsed().as_nanos());
                let chunk = format!("{:x}\r\n{data}\r\n", data.len());
                if socket.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
            }
            let done = "data: [DONE]\n\n";
            let _ = socket
                .write_all(format!("{:x}\r\n{done}\r\n0\r\n\r\n", done.len()).as_bytes())
                .await;
        });
    }
}
