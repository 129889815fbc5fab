//! What ingresses and servers do to a replay (issue 19, items 9–12), over real sockets: a
//! buffering reverse proxy that delivers each stream in one piece (nginx's default
//! `proxy_buffering on`), the protocol and TLS version that carried the run, a cleartext
//! HTTP/2-only server reached without `--target-h2c`, and a stream cut right after its `200`
//! head (a gateway's read timeout shorter than the TTFT), on HTTP/1.1 and HTTP/2 alike.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;

use fixtures::{MockServer, TempDir, llm_replay, num, write_chat_recording};
use serde_json::Value;

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A private CA and a leaf certificate for `localhost` signed by it: `ca.pem`, `leaf.pem`,
/// `leaf.key` in `dir`.
fn private_ca(dir: &TempDir) {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "llm-replay ingress test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .expect("leaf params")
        .signed_by(&leaf_key, &issuer)
        .expect("leaf certificate");
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).expect("write ca.pem");
    std::fs::write(dir.join("leaf.pem"), leaf.pem()).expect("write leaf.pem");
    std::fs::write(dir.join("leaf.key"), leaf_key.serialize_pem()).expect("write leaf.key");
}

/// `run RECORDING --target TARGET --schedule asap --concurrency 2 EXTRA...`.
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

/// A buffering reverse proxy on 127.0.0.1:0, as nginx is with `proxy_buffering on` for an
/// HTTP/1.1 client: each request goes to `upstream` on a connection of its own; the whole
/// response is read to its end and only then written to the client, in one write.
fn start_buffering_proxy(upstream: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let upstream = upstream
        .strip_prefix("http://")
        .expect("a cleartext upstream")
        .to_owned();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { break };
            let upstream = upstream.clone();
            std::thread::spawn(move || buffer_one_connection(client, &upstream));
        }
    });
    url
}

/// Serve one request of the buffering proxy; the client's connection closes after it, as
/// the upstream's `connection: close` said.
fn buffer_one_connection(client: TcpStream, upstream: &str) {
    let mut reader = BufReader::new(client.try_clone().expect("clone"));
    let mut writer = client;
    // The request head, minus its `connection` header (the proxy closes upstream).
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
    head.push_str("connection: close\r\n\r\n");
    let Ok(mut up) = TcpStream::connect(upstream) else {
        return;
    };
    if up.write_all(head.as_bytes()).is_err() || up.write_all(&body).is_err() {
        return;
    }
    // Buffered: the whole upstream response, then one write to the client.
    let mut whole = Vec::new();
    if up.read_to_end(&mut whole).is_err() {
        return;
    }
    let _ = writer.write_all(&whole);
    let _ = writer.flush();
    let _ = writer.shutdown(Shutdown::Both);
}

fn warnings(report: &Value) -> Vec<String> {
    report["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter_map(|w| w.as_str().map(str::to_owned))
        .collect()
}

/// Item 9: a buffering proxy holds every stream and delivers it in one read. The streams
/// are counted as coalesced, the report warns naming the likely cause, and a comparison
/// with a run straight to the server marks the ITL change as coming from the coalescing.
#[test]
fn a_buffering_proxy_is_detected_counted_and_named() {
    // Runs alone: the unbuffered run must flag no stream, and a client starved of a core
    // for a stream's length (the parallel tests' start) reads it in one piece as well.
    let _timing = fixtures::timing_lock();
    let dir = TempDir::new("ingress-buffering");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 8, 20, None);
    // Twenty tokens 10 ms apart after 50 ms: a stream that lasts about 240 ms.
    let mock = MockServer::start(&["--ttft", "50ms", "--itl", "10ms", "--http1-only"]);
    let proxy = start_buffering_proxy(&mock.url);

    // Straight to the server: streamed, nothing coalesced, no warning.
    let direct_path = dir.join("direct.json");
    let out = llm_replay(
        &run_args(path_str(&recording), &mock.url, &[]),
        Some(&direct_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let direct = out.report.expect("report JSON");
    assert_eq!(num(&direct, &["requests", "succeeded"]), 8.0, "{direct:#}");
    assert_eq!(
        num(&direct, &["transport", "streams_checked"]),
        8.0,
        "{direct:#}"
    );
    assert_eq!(
        num(&direct, &["transport", "coalesced_streams"]),
        0.0,
        "{direct:#}"
    );
    assert!(
        !warnings(&direct).iter().any(|w| w.contains("one piece")),
        "{direct:#}"
    );
    let direct_itl = num(&direct, &["llm", "itl_ms", "p50"]);
    assert!(direct_itl > 5.0, "streamed ITL {direct_itl} ms");

    // Through the buffering proxy, compared with the direct run.
    let proxied_path = dir.join("proxied.json");
    let out = llm_replay(
        &run_args(
            path_str(&recording),
            &proxy,
            &["--baseline", path_str(&direct_path)],
        ),
        Some(&proxied_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let proxied = out.report.expect("report JSON");
    assert_eq!(
        num(&proxied, &["requests", "succeeded"]),
        8.0,
        "{proxied:#}"
    );
    assert_eq!(
        num(&proxied, &["transport", "coalesced_streams"]),
        8.0,
        "{proxied:#}"
    );
    assert_eq!(
        num(&proxied, &["transport", "coalesced_share_pct"]),
        100.0,
        "{proxied:#}"
    );
    // What the user of the issue saw: TTFT = latency, ITL of a read loop.
    let itl = num(&proxied, &["llm", "itl_ms", "p50"]);
    assert!(itl < 1.0, "coalesced ITL {itl} ms");
    let warned = warnings(&proxied);
    assert!(
        warned.iter().any(
            |w| w.contains("8 of 8 streams (100.0 %) arrived in one piece")
                && w.contains("buffering reverse proxy")
                && w.contains("proxy_buffering off")
                && w.contains("X-Accel-Buffering: no")
        ),
        "{warned:#?}"
    );
    let changes = &proxied["baseline"]["changes"];
    assert_eq!(changes["itl_ms.p50"]["coalesced"], true, "{changes:#}");
    assert_eq!(
        changes["tokens_per_second_per_user.p50"]["coalesced"], true,
        "{changes:#}"
    );
    // The first token waited for the buffer: TTFT is marked like ITL (issue 33, item 2).
    assert_eq!(changes["ttft_ms.p50"]["coalesced"], true, "{changes:#}");
    assert!(
        changes["latency_ms.p50"].get("coalesced").is_none(),
        "{changes:#}"
    );
    assert!(
        out.stdout.contains("arrived in one piece"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("‡ coalesced"), "{}", out.stdout);
}

/// The `transport.connections` entries of a report as `(protocol, tls)` pairs.
fn connection_kinds(report: &Value) -> Vec<(String, String)> {
    report["transport"]["connections"]
        .as_array()
        .unwrap_or_else(|| panic!("no transport.connections: {report:#}"))
        .iter()
        .map(|c| {
            assert!(c["count"].as_u64().is_some_and(|n| n >= 1), "{c}");
            (
                c["protocol"].as_str().expect("protocol").to_owned(),
                c["tls"].as_str().expect("tls").to_owned(),
            )
        })
        .collect()
}

/// Item 10: the report says which protocol and TLS version carried the run, counting the
/// connections of each: HTTP/1.1 cleartext, h2c, HTTP/2 by ALPN over TLS 1.3, HTTP/1.1 over
/// TLS 1.3.
#[test]
fn connections_are_counted_by_protocol_and_tls_version() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("ingress-protocols");
    private_ca(&dir);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 6, 5, None);
    let (ca, cert, key) = (
        dir.join("ca.pem"),
        dir.join("leaf.pem"),
        dir.join("leaf.key"),
    );
    let tls = ["--tls-cert", path_str(&cert), "--tls-key", path_str(&key)];
    // (name, mock flags, run flags, the one (protocol, TLS version) expected, its terminal text)
    type Case<'a> = (
        &'a str,
        Vec<&'a str>,
        Vec<&'a str>,
        (&'a str, &'a str),
        &'a str,
    );
    let cases: [Case<'_>; 4] = [
        (
            "http1",
            vec!["--http1-only"],
            vec![],
            ("http/1.1", "none"),
            "http/1.1: 6 requests on ",
        ),
        (
            "h2c",
            vec![],
            vec!["--target-h2c"],
            ("h2c", "none"),
            "h2c: 6 requests on ",
        ),
        (
            "h2-tls",
            tls.to_vec(),
            vec!["--target-ca", path_str(&ca)],
            ("h2", "TLSv1.3"),
            "h2 TLSv1.3: 6 requests on ",
        ),
        (
            "http1-tls",
            [&tls[..], &["--http1-only"]].concat(),
            vec!["--target-ca", path_str(&ca)],
            ("http/1.1", "TLSv1.3"),
            "http/1.1 TLSv1.3: 6 requests on ",
        ),
    ];
    for (name, mut mock_args, extra, (protocol, version), shown) in cases {
        mock_args.extend(["--ttft", "2ms", "--itl", "1ms"]);
        let mock = MockServer::start(&mock_args);
        let target = mock.url.replace("127.0.0.1", "localhost");
        let report_path = dir.join(&format!("{name}.json"));
        let out = llm_replay(
            &run_args(path_str(&recording), &target, &extra),
            Some(&report_path),
        );
        assert_eq!(
            out.code, 0,
            "{name}: stdout:\n{}\nstderr:\n{}",
            out.stdout, out.stderr
        );
        let report = out.report.expect("report JSON");
        assert_eq!(num(&report, &["requests", "succeeded"]), 6.0, "{report:#}");
        let kinds = connection_kinds(&report);
        assert_eq!(
            kinds,
            vec![(protocol.to_owned(), version.to_owned())],
            "{name}: {:#}",
            report["transport"]
        );
        // Issue 33, item 8: requests are counted per protocol, apart from connections
        // (HTTP/2 carries several requests on one connection).
        assert_eq!(
            report["transport"]["requests"],
            serde_json::json!([{ "protocol": protocol, "count": 6 }]),
            "{name}: {:#}",
            report["transport"]
        );
        // Every connection counted is one the run timed.
        let counted: f64 = report["transport"]["connections"]
            .as_array()
            .expect("connections")
            .iter()
            .filter_map(|c| c["count"].as_f64())
            .sum();
        assert_eq!(
            counted,
            num(&report, &["llm", "connect_ms", "count"]),
            "{name}: {report:#}"
        );
        assert!(
            out.stdout.contains(&format!("protocols        {shown}")),
            "{name}: {}",
            out.stdout
        );
        // The Markdown and HTML reports say it too.
        let md = dir.join(&format!("{name}.md"));
        let html = dir.join(&format!("{name}.html"));
        let out = llm_replay(
            &[
                "report",
                path_str(&report_path),
                "--report-md",
                path_str(&md),
                "--report-html",
                path_str(&html),
            ],
            None,
        );
        assert_eq!(out.code, 0, "{name}: {}", out.stderr);
        let md = std::fs::read_to_string(&md).expect("markdown");
        assert!(md.contains(&format!("protocols {shown}")), "{name}: {md}");
        let html = std::fs::read_to_string(&html).expect("html");
        assert!(
            html.contains(&format!("<li>Protocols: {shown}")),
            "{name}: {html}"
        );
    }
}

/// Item 11: a cleartext HTTP/2-only server reached without `--target-h2c` answers the
/// HTTP/1.1 request with HTTP/2's SETTINGS frame: the failure is named `http2_only` and the
/// run says to use `--target-h2c` (and with it, the run succeeds).
#[test]
fn an_http2_only_server_without_target_h2c_is_named_with_the_fix() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("ingress-h2-only");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 4, 5, None);
    let mock = MockServer::start(&["--ttft", "2ms", "--itl", "1ms", "--http2-only"]);

    let report_path = dir.join("without.json");
    let out = llm_replay(
        &run_args(path_str(&recording), &mock.url, &[]),
        Some(&report_path),
    );
    assert_eq!(
        out.code, 3,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    let report = out.report.expect("report JSON");
    let causes = &report["requests"]["failed_by_kind"]["transport_causes"];
    assert_eq!(causes["http2_only"], 4, "{report:#}");
    assert_eq!(causes["other"], 0, "{report:#}");
    assert!(
        out.stderr.contains("speaks only cleartext HTTP/2") && out.stderr.contains("--target-h2c"),
        "{}",
        out.stderr
    );
    assert!(
        warnings(&report).iter().any(|w| w.contains("--target-h2c")),
        "{report:#}"
    );

    let report_path = dir.join("with.json");
    let out = llm_replay(
        &run_args(path_str(&recording), &mock.url, &["--target-h2c"]),
        Some(&report_path),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
}

/// Item 12: a stream cut right after its `200` head, before any content (nginx
/// `proxy_read_timeout` shorter than the TTFT), has one label on every transport:
/// `closed_after_head`, and its status 200 in `--requests-out`.
#[test]
fn a_stream_cut_after_its_head_has_one_label_on_every_transport() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("ingress-cut-after-head");
    private_ca(&dir);
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 4, 5, None);
    let (ca, cert, key) = (
        dir.join("ca.pem"),
        dir.join("leaf.pem"),
        dir.join("leaf.key"),
    );
    let cut = [
        "--ttft",
        "20ms",
        "--itl",
        "1ms",
        "--cut-after-head-rate",
        "1",
    ];
    let cases: [(&str, Vec<&str>, Vec<&str>); 3] = [
        ("http1", vec!["--http1-only"], vec![]),
        ("h2c", vec![], vec!["--target-h2c"]),
        (
            "h2-tls",
            vec!["--tls-cert", path_str(&cert), "--tls-key", path_str(&key)],
            vec!["--target-ca", path_str(&ca)],
        ),
    ];
    for (name, mut mock_args, extra) in cases {
        mock_args.extend(cut);
        let mock = MockServer::start(&mock_args);
        let target = mock.url.replace("127.0.0.1", "localhost");
        let lines = dir.join(&format!("{name}-requests.jsonl"));
        let mut extra = extra;
        extra.extend(["--requests-out", path_str(&lines)]);
        let report_path = dir.join(&format!("{name}.json"));
        let out = llm_replay(
            &run_args(path_str(&recording), &target, &extra),
            Some(&report_path),
        );
        assert_eq!(
            out.code, 3,
            "{name}: stdout:\n{}\nstderr:\n{}",
            out.stdout, out.stderr
        );
        let report = out.report.expect("report JSON");
        let kind = &report["requests"]["failed_by_kind"];
        assert_eq!(kind["transport"], 4, "{name}: {report:#}");
        assert_eq!(
            kind["transport_causes"]["closed_after_head"], 4,
            "{name}: {report:#}"
        );
        assert!(
            out.stdout.contains("closed after head 4"),
            "{name}: {}",
            out.stdout
        );
        assert!(
            warnings(&report)
                .iter()
                .any(|w| w.contains("closed after head") && w.contains("proxy_read_timeout")),
            "{name}: {report:#}"
        );
        let text = std::fs::read_to_string(&lines).expect("requests-out");
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(records.len(), 4, "{name}: {text}");
        for record in &records {
            assert_eq!(record["status"], 200, "{name}: {record}");
            assert_eq!(record["outcome"], "transport", "{name}: {record}");
        }
    }
}
