//! The replay's transport, against real servers on loopback: https with a private CA (HTTP/1.1
//! and HTTP/2 by ALPN), certificate errors named, `--insecure` warned, cleartext HTTP/2
//! (`--target-h2c`), one resend when a server closes keep-alive connections after each
//! stream (as llama.cpp does), and transport failures reported by cause.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use fixtures::{MockServer, TempDir, llm_replay, num, write_chat_recording};

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A private CA and a leaf certificate for `localhost` and 127.0.0.1 signed by it, written
/// as `ca.pem`, `leaf.pem` and `leaf.key` in `dir`.
fn private_ca(dir: &TempDir) {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "llm-replay test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
    let leaf_params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("leaf params");
    let leaf = leaf_params
        .signed_by(&leaf_key, &issuer)
        .expect("leaf certificate");
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).expect("write ca.pem");
    std::fs::write(dir.join("leaf.pem"), leaf.pem()).expect("write leaf.pem");
    std::fs::write(dir.join("leaf.key"), leaf_key.serialize_pem()).expect("write leaf.key");
}

/// The HTTP versions the mock's request log recorded, one per request.
fn logged_versions(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|v| v["version"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// `https://localhost:PORT` for a mock listening on `https://127.0.0.1:PORT`.
fn localhost_url(mock: &MockServer) -> String {
    mock.url.replace("127.0.0.1", "localhost")
}

fn run_args<'a>(recording: &'a str, target: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        recording,
        "--target",
        target,
        "--schedule",
        "asap",
        "--concurrency",
        "2",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn https_target_with_private_ca_over_http1_and_http2() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("tls-ca");
    private_ca(&dir);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 12, 5, None);
    let ca = dir.join("ca.pem");
    let (cert, key) = (dir.join("leaf.pem"), dir.join("leaf.key"));
    for (http1_only, expected_version) in [(false, "HTTP/2.0"), (true, "HTTP/1.1")] {
        let log = dir.join(&format!("requests-{http1_only}.jsonl"));
        let mut mock_args = vec![
            "--ttft",
            "2ms",
            "--itl",
            "1ms",
            "--tls-cert",
            path_str(&cert),
            "--tls-key",
            path_str(&key),
            "--request-log",
            path_str(&log),
        ];
        if http1_only {
            mock_args.push("--http1-only");
        }
        let mock = MockServer::start(&mock_args);
        assert!(mock.url.starts_with("https://"), "{}", mock.url);
        let target = localhost_url(&mock);
        let report_path = dir.join(&format!("report-{http1_only}.json"));
        let out = llm_replay(
            &run_args(
                path_str(&recording),
                &target,
                &["--target-ca", path_str(&ca)],
            ),
            Some(&report_path),
        );
        assert_eq!(
            out.code, 0,
            "stdout:\n{}\nstderr:\n{}",
            out.stdout, out.stderr
        );
        let report = out.report.expect("report JSON");
        assert_eq!(num(&report, &["requests", "succeeded"]), 12.0, "{report:#}");
        assert!(report["run"].get("insecure").is_none(), "{report:#}");
        let versions = logged_versions(&log);
        assert_eq!(versions.len(), 12, "{versions:?}");
        assert!(
            versions.iter().all(|v| v == expected_version),
            "expected {expected_version}: {versions:?}"
        );
        // Connection setup and the TLS handshake are timed apart, once per connection
        // opened. HTTP/1.1 opens at least one per slot (2), more when the next request of a
        // slot goes out before hyper's pool has its connection back. Over HTTP/2 one
        // connection can carry both streams, but the client learns that the server speaks
        // HTTP/2 only from the first handshake (ALPN): two first requests that race may each
        // open one. Every connection opened had its handshake timed.
        let connects = num(&report, &["llm", "connect_ms", "count"]);
        let least = if http1_only { 2.0 } else { 1.0 };
        assert!((least..=12.0).contains(&connects), "{:#}", report["llm"]);
        assert_eq!(
            num(&report, &["llm", "tls_handshake_ms", "count"]),
            connects,
            "({expected_version}): {:#}",
            report["llm"]
        );
        let handshake = num(&report, &["llm", "tls_handshake_ms", "p50"]);
        assert!(handshake > 0.0, "TLS handshake {handshake} ms");
    }
}

#[test]
fn untrusted_certificate_is_named_and_insecure_is_warned() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("tls-untrusted");
    private_ca(&dir);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 6, 5, None);
    let mock = MockServer::start(&[
        "--ttft",
        "2ms",
        "--itl",
        "1ms",
        "--tls-cert",
        path_str(&dir.join("leaf.pem")),
        "--tls-key",
        path_str(&dir.join("leaf.key")),
    ]);
    let target = localhost_url(&mock);

    // Without --target-ca the private CA is unknown: the run fails and says why.
    let report_path = dir.join("untrusted.json");
    let out = llm_replay(
        &run_args(path_str(&recording), &target, &[]),
        Some(&report_path),
    );
    assert_ne!(out.code, 0, "stdout:\n{}", out.stdout);
    let all = format!("{}\n{}", out.stdout, out.stderr);
    assert!(all.contains("unknown issuer"), "{all}");
    assert!(!all.contains("unreachable"), "{all}");
    let report = out.report.expect("report JSON");
    let kind = &report["requests"]["failed_by_kind"];
    assert_eq!(kind["transport"], 6, "{report:#}");
    assert_eq!(kind["transport_causes"]["tls"], 6, "{report:#}");
    assert_eq!(kind["tls_problems"]["unknown issuer"], 6, "{report:#}");

    // With --insecure it succeeds, and the report says verification was off.
    let report_path = dir.join("insecure.json");
    let out = llm_replay(
        &run_args(path_str(&recording), &target, &["--insecure"]),
        Some(&report_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report JSON");
    assert_eq!(num(&report, &["requests", "succeeded"]), 6.0, "{report:#}");
    assert_eq!(report["run"]["insecure"], true, "{report:#}");
    assert!(
        report["warnings"]
            .as_array()
            .expect("warnings")
            .iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains("--insecure"))),
        "{report:#}"
    );
    assert!(out.stdout.contains("INSECURE"), "{}", out.stdout);
}

#[test]
fn a_bad_target_ca_is_a_usage_error_naming_the_file() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("tls-bad-ca");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 1, 5, None);
    let bogus = dir.join("bogus.pem");
    std::fs::write(&bogus, "not a certificate\n").expect("write");
    let missing = dir.join("missing.pem");
    for ca in [&bogus, &missing] {
        let out = llm_replay(
            &run_args(
                path_str(&recording),
                "https://localhost:1",
                &["--target-ca", path_str(ca)],
            ),
            None,
        );
        assert_eq!(out.code, 2, "{}", out.stderr);
        assert!(out.stderr.contains(path_str(ca)), "{}", out.stderr);
    }
    let out = llm_replay(
        &run_args(path_str(&recording), "ftp://localhost:1", &[]),
        None,
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("ftp"), "{}", out.stderr);
}

#[test]
fn target_h2c_speaks_cleartext_http2() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("h2c");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 8, 5, None);
    for (h2c, expected_version) in [(true, "HTTP/2.0"), (false, "HTTP/1.1")] {
        let log = dir.join(&format!("requests-{h2c}.jsonl"));
        let mock = MockServer::start(&[
            "--ttft",
            "2ms",
            "--itl",
            "1ms",
            "--request-log",
            path_str(&log),
        ]);
        let extra: &[&str] = if h2c { &["--target-h2c"] } else { &[] };
        let report_path = dir.join(&format!("report-{h2c}.json"));
        let out = llm_replay(
            &run_args(path_str(&recording), &mock.url, extra),
            Some(&report_path),
        );
        assert_eq!(
            out.code, 0,
            "stdout:\n{}\nstderr:\n{}",
            out.stdout, out.stderr
        );
        let report = out.report.expect("report JSON");
        assert_eq!(num(&report, &["requests", "succeeded"]), 8.0, "{report:#}");
        let versions = logged_versions(&log);
        assert_eq!(versions.len(), 8, "{versions:?}");
        assert!(
            versions.iter().all(|v| v == expected_version),
            "expected {expected_version}: {versions:?}"
        );
    }
}

const SSE_EVENTS: [&str; 4] = [
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
];

/// Read one request (head and `Content-Length` body); `false` when the peer closed first.
fn read_request(reader: &mut BufReader<TcpStream>) -> bool {
    let mut content_length = 0usize;
    let mut first = true;
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        if line == "\r\n" && !first {
            break;
        }
        first = false;
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            content_length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; content_length];
    reader.read_exact(&mut body).is_ok()
}

/// One connection of the closing server: answer one streamed request (chunked, no
/// `Content-Length`, no `Connection: close`), then close, at the latest when the client
/// writes its next request on this connection.
fn serve_then_close(stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(stream.try_clone().expect("clone stream"));
    let mut writer = stream;
    if !read_request(&mut reader) {
        return;
    }
    let mut response = String::from(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
    );
    for event in SSE_EVENTS {
        response.push_str(&format!("{:x}\r\n{event}\r\n", event.len()));
    }
    response.push_str("0\r\n\r\n");
    if writer.write_all(response.as_bytes()).is_err() {
        return;
    }
    let _ = writer.flush();
    // The client thinks the connection can be reused: wait for its next request (or a short
    // while), then close without answering, as llama.cpp's server does.
    let _ = reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(300)));
    let _ = read_request(&mut reader);
    let _ = writer.shutdown(std::net::Shutdown::Both);
}

/// A server on 127.0.0.1:0 that closes every connection after one response; returns its URL.
fn closing_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { break };
            std::thread::spawn(move || serve_then_close(stream));
        }
    });
    url
}

#[test]
fn a_server_closing_keep_alive_connections_loses_no_request() {
    let _parallel = fixtures::parallel_lock();
    let url = closing_server();
    let dir = TempDir::new("resend");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 40, 5, None);
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &url,
            "--schedule",
            "asap",
            "--concurrency",
            "1",
        ],
        Some(&report_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report JSON");
    assert_eq!(num(&report, &["requests", "succeeded"]), 40.0, "{report:#}");
    assert_eq!(num(&report, &["requests", "failed"]), 0.0, "{report:#}");
    assert_eq!(num(&report, &["requests", "total"]), 40.0, "{report:#}");
    let resent = num(&report, &["requests", "resent"]);
    assert!(resent > 0.0, "{report:#}");
    assert!(out.stdout.contains("resent"), "{}", out.stdout);
}

#[test]
fn a_refused_connection_is_reported_as_refused() {
    let _parallel = fixtures::parallel_lock();
    let refused = fixtures::RefusedAddr::new();
    let dir = TempDir::new("refused");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 5, 5, None);
    let report_path = dir.join("report.json");
    let target = refused.url();
    let out = llm_replay(
        &run_args(path_str(&recording), &target, &[]),
        Some(&report_path),
    );
    assert_eq!(
        out.code, 3,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    assert!(out.stderr.contains("unreachable"), "{}", out.stderr);
    let report = out.report.expect("report JSON");
    let kind = &report["requests"]["failed_by_kind"];
    assert_eq!(kind["transport"], 5, "{report:#}");
    assert_eq!(kind["transport_causes"]["refused"], 5, "{report:#}");
    assert!(out.stdout.contains("refused 5"), "{}", out.stdout);
}
