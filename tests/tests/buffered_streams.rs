//! Issue 33, items 1–2: long streams through a buffering ingress. nginx with
//! `proxy_buffering on` (its default) sends an HTTP/1.1 client over TLS the response head at
//! once and the body in 16 KiB blocks: a 200-token stream arrives in a few blocks, each read
//! chunk by chunk (one read per transfer-encoding chunk) within microseconds. The forwarder
//! here does exactly that, over real TLS (rustls) in front of the mock; the coalescing is
//! detected from the arrival instants, whatever the number of reads, and the TTFT change is
//! marked. An unbuffered path — straight to the server, a token every millisecond at c=64 —
//! stays at 0 flagged.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;

use fixtures::{MockServer, TempDir, llm_replay, num, write_chat_recording};
use serde_json::Value;

/// nginx's default buffer for HTTP/1.1 over TLS: a block is flushed once this much is held.
const BLOCK: usize = 16 * 1024;

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A private CA (written as `ca.pem` in `dir`) and a server configuration for `localhost`
/// with a leaf it signed, speaking HTTP/1.1 only.
fn tls_server(dir: &TempDir) -> Arc<rustls::ServerConfig> {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "llm-replay buffering test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .expect("leaf params")
        .signed_by(&leaf_key, &issuer)
        .expect("leaf certificate");
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).expect("write ca.pem");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .expect("server certificate");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A TLS forwarder on 127.0.0.1:0 that buffers as nginx does: each request goes to
/// `upstream` (cleartext) on a connection of its own; the response head is sent at once,
/// the body in [`BLOCK`]-byte blocks as they fill, the rest at the end. Returns its
/// `https://localhost:PORT` URL.
fn start_block_buffering_forwarder(upstream: &str, tls: Arc<rustls::ServerConfig>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let upstream = upstream
        .strip_prefix("http://")
        .expect("a cleartext upstream")
        .to_owned();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { break };
            let (upstream, tls) = (upstream.clone(), Arc::clone(&tls));
            std::thread::spawn(move || {
                let Ok(connection) = rustls::ServerConnection::new(tls) else {
                    return;
                };
                forward_one(rustls::StreamOwned::new(connection, client), &upstream);
            });
        }
    });
    format!("https://localhost:{port}")
}

/// Serve one request; the client's connection closes after it.
fn forward_one(client: rustls::StreamOwned<rustls::ServerConnection, TcpStream>, upstream: &str) {
    let mut reader = BufReader::new(client);
    let mut head = String::new();
    let mut content_length = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("content-length:") {
            content_length = value.trim().parse().unwrap_or(0);
        }
        if !lower.starts_with("connection:") {
            head.push_str(&line);
        }
    }
    let mut body = vec![0u8; content_length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let mut client = reader.into_inner();
    head.push_str("connection: close\r\n\r\n");
    let Ok(mut up) = TcpStream::connect(upstream) else {
        return;
    };
    if up.write_all(head.as_bytes()).is_err() || up.write_all(&body).is_err() {
        return;
    }
    let mut held: Vec<u8> = Vec::new();
    let mut head_sent = false;
    let mut buf = [0u8; 4096];
    loop {
        let n = match up.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        held.extend_from_slice(&buf[..n]);
        if !head_sent && let Some(end) = held.windows(4).position(|w| w == b"\r\n\r\n") {
            // The head goes at once (the client knows the response started).
            let rest = held.split_off(end + 4);
            if client.write_all(&held).is_err() || client.flush().is_err() {
                return;
            }
            held = rest;
            head_sent = true;
        }
        while head_sent && held.len() >= BLOCK {
            let rest = held.split_off(BLOCK);
            if client.write_all(&held).is_err() || client.flush().is_err() {
                return;
            }
            held = rest;
        }
    }
    let _ = client.write_all(&held);
    let _ = client.flush();
    client.conn.send_close_notify();
    let _ = client.flush();
}

/// A recording of 8 chat exchanges: 4 asking for 60 tokens, 4 for 200.
fn mixed_recording(dir: &TempDir) -> std::path::PathBuf {
    let short = dir.join("short.jsonl");
    let long = dir.join("long.jsonl");
    write_chat_recording(&short, 4, 60, None);
    write_chat_recording(&long, 4, 200, None);
    let both = dir.join("rec.jsonl");
    let mut text = std::fs::read_to_string(&short).expect("short");
    text.push_str(&std::fs::read_to_string(&long).expect("long"));
    std::fs::write(&both, text).expect("write the recording");
    both
}

fn run(recording: &Path, target: &str, extra: &[&str], report: &Path) -> Value {
    let mut args = vec![
        "run",
        path_str(recording),
        "--target",
        target,
        "--schedule",
        "asap",
    ];
    args.extend_from_slice(extra);
    let out = llm_replay(&args, Some(report));
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    out.report.expect("report JSON")
}

fn warnings(report: &Value) -> String {
    report["warnings"].to_string()
}

/// Item 1 and 2: through a 16 KiB block-buffering TLS forwarder, ≥ 90 % of the 60- and
/// 200-token streams are flagged (the 200-token ones arrive in 2–3 blocks, each read chunk
/// by chunk), the warning names `proxy_buffering off`, and the TTFT change against the
/// unbuffered run is marked; the unbuffered run flags none.
#[test]
fn long_streams_through_a_block_buffering_ingress_are_flagged() {
    // Runs alone: the unbuffered run must flag no stream, and a client starved of a core
    // for a stream's length (the parallel tests' start) reads it in one piece as well.
    let _timing = fixtures::timing_lock();
    let dir = TempDir::new("block-buffering");
    let recording = mixed_recording(&dir);
    // A token every 5 ms after 20 ms: a 200-token stream lasts about a second.
    let mock = MockServer::start(&["--ttft", "20ms", "--itl", "5ms", "--http1-only"]);
    let forwarder = start_block_buffering_forwarder(&mock.url, tls_server(&dir));

    let direct_path = dir.join("direct.json");
    let direct = run(&recording, &mock.url, &["--concurrency", "4"], &direct_path);
    assert_eq!(num(&direct, &["requests", "succeeded"]), 8.0, "{direct:#}");
    assert_eq!(
        num(&direct, &["transport", "coalesced_streams"]),
        0.0,
        "{direct:#}"
    );

    let ca = dir.join("ca.pem");
    let buffered = run(
        &recording,
        &forwarder,
        &[
            "--concurrency",
            "4",
            "--target-ca",
            path_str(&ca),
            "--baseline",
            path_str(&direct_path),
        ],
        &dir.join("buffered.json"),
    );
    assert_eq!(
        num(&buffered, &["requests", "succeeded"]),
        8.0,
        "{buffered:#}"
    );
    let checked = num(&buffered, &["transport", "streams_checked"]);
    let flagged = num(&buffered, &["transport", "coalesced_streams"]);
    eprintln!("flagged {flagged} of {checked} buffered streams");
    assert_eq!(checked, 8.0, "{buffered:#}");
    assert!(flagged >= 0.9 * checked, "{buffered:#}");
    assert!(
        warnings(&buffered).contains("proxy_buffering off"),
        "{}",
        warnings(&buffered)
    );
    let changes = &buffered["baseline"]["changes"];
    assert_eq!(changes["ttft_ms.p50"]["coalesced"], true, "{changes:#}");
    assert_eq!(changes["itl_ms.p50"]["coalesced"], true, "{changes:#}");
}

/// Item 1, the other side: a server streaming a token every millisecond, 64 streams at once,
/// read straight (cleartext HTTP/1.1) — many reads, many of them late on this 2-core
/// machine — flags none. It runs alone: whether reads come late is a matter of time, and
/// the parallel tests starting together load both cores enough to make a stream look
/// coalesced.
#[test]
fn a_fast_unbuffered_server_at_c64_flags_no_stream() {
    let _timing = fixtures::timing_lock();
    let dir = TempDir::new("fast-unbuffered");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 128, 100, None);
    let mock = MockServer::start(&["--ttft", "20ms", "--itl", "1ms"]);
    let report = run(
        &recording,
        &mock.url,
        &["--concurrency", "64"],
        &dir.join("fast.json"),
    );
    assert_eq!(
        num(&report, &["requests", "succeeded"]),
        128.0,
        "{report:#}"
    );
    assert_eq!(
        num(&report, &["transport", "streams_checked"]),
        128.0,
        "{report:#}"
    );
    assert_eq!(
        num(&report, &["transport", "coalesced_streams"]),
        0.0,
        "{report:#}"
    );
}
