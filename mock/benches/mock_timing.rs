//! Timing benchmark of `llm-replay mock`: TTFT, ITL and latency as a client measures them.
//!
//! Run: `cargo bench -p llm-replay-mock --bench mock_timing [-- CONCURRENCY...]`.
//! The mock serves `--ttft 200ms --itl 10ms --tokens 100` in-process on its own runtime; the
//! clients are plain blocking threads (one connection per stream, HTTP/1.1 chunked, t0 taken
//! just before the request write, each token frame stamped when its read returns) so the
//! client adds as little scheduling noise as possible. Prints p50/p90/p99 per concurrency and
//! whether the targets hold: TTFT p50 within 2 ms of 200 ms, ITL p50 within 0.5 ms of 10 ms,
//! latency p50 within 3 ms of 1,190 ms.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use mock::{MockConfig, serve};

const BODY: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
const TOKEN_MARK: &[u8] = b"{\"content\":\"";

struct Sample {
    ttft_ms: f64,
    itl_ms: f64,
    latency_ms: f64,
}

fn one_stream(addr: SocketAddr) -> std::io::Result<Sample> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let t0 = Instant::now();
    stream.write_all(request.as_bytes())?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut window: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut stamps: Vec<f64> = Vec::with_capacity(128);
    loop {
        let n = stream.read(&mut buf)?;
        let at = t0.elapsed().as_secs_f64() * 1000.0;
        if n == 0 {
            break;
        }
        window.extend_from_slice(&buf[..n]);
        let found = window
            .windows(TOKEN_MARK.len())
            .filter(|w| *w == TOKEN_MARK)
            .count();
        stamps.extend(std::iter::repeat_n(at, found));
        // Keep a tail so a mark split across reads is still found once.
        let keep = window.len().min(TOKEN_MARK.len() - 1);
        window.drain(..window.len() - keep);
    }
    let (Some(&first), Some(&last)) = (stamps.first(), stamps.last()) else {
        return Err(std::io::Error::other("no token frames"));
    };
    Ok(Sample {
        ttft_ms: first,
        itl_ms: (last - first) / (stamps.len() as f64 - 1.0).max(1.0),
        latency_ms: last,
    })
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[((values.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let levels: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let levels = if levels.is_empty() {
        vec![1, 16, 128]
    } else {
        levels
    };

    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let config = MockConfig {
        ttft: Duration::from_millis(200),
        itl: Duration::from_millis(10),
        tokens: Some(100),
        ..MockConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(serve(listener, config, async {
        let _ = stopped.await;
    }));

    let mut all_ok = true;
    for concurrency in levels {
        // At least 48 streams per level and 3 per client: about a minute per level at most.
        let per_client = (48 / concurrency).max(3);
        let clients: Vec<_> = (0..concurrency)
            .map(|i| {
                std::thread::spawn(move || {
                    // Spread the starts over one ITL so streams do not all tick in lockstep.
                    std::thread::sleep(Duration::from_micros((i as u64 * 7919) % 10_000));
                    (0..per_client)
                        .map(|_| one_stream(addr))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut ttft = Vec::new();
        let mut itl = Vec::new();
        let mut latency = Vec::new();
        let mut errors = 0;
        for client in clients {
            for sample in client.join().expect("client thread") {
                match sample {
                    Ok(s) => {
                        ttft.push(s.ttft_ms);
                        itl.push(s.itl_ms);
                        latency.push(s.latency_ms);
                    }
                    Err(_) => errors += 1,
                }
            }
        }
        let (t50, i50, l50) = (
            percentile(&mut ttft, 0.5),
            percentile(&mut itl, 0.5),
            percentile(&mut latency, 0.5),
        );
        let ok = errors == 0
            && (t50 - 200.0).abs() <= 2.0
            && (i50 - 10.0).abs() <= 0.5
            && (l50 - 1190.0).abs() <= 3.0;
        all_ok &= ok;
        println!(
            "concurrency {concurrency:>3}: streams {:>4} errors {errors} | TTFT p50 {t50:.3} p90 {:.3} p99 {:.3} | ITL p50 {i50:.3} p90 {:.3} p99 {:.3} | latency p50 {l50:.3} p90 {:.3} p99 {:.3} ms | {}",
            ttft.len(),
            percentile(&mut ttft, 0.9),
            percentile(&mut ttft, 0.99),
            percentile(&mut itl, 0.9),
            percentile(&mut itl, 0.99),
            percentile(&mut latency, 0.9),
            percentile(&mut latency, 0.99),
            if ok {
                "within target"
            } else {
                "OUTSIDE target"
            }
        );
    }
    let _ = stop.send(());
    if let Ok(Err(error)) = runtime.block_on(server) {
        eprintln!("serve failed: {error}");
    }
    if !all_ok {
        std::process::exit(1);
    }
}
