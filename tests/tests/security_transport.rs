//! Issue 18 (security, second review), the transport side, with real processes on loopback:
//! a flood of silent connections on `--metrics-listen` (under a small open-files limit)
//! neither spins nor stops the run; the worker's health check binds the address it is
//! given; a redirect is never followed on any transport (the credentials stay with the
//! target's origin) and counts as a failed request with its 3xx status; a control
//! character in a `--header` value, and a `--workers` count past the limit, are usage
//! errors before anything is sent or started.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fixtures::{
    MockServer, Spawned, TempDir, bin, eventually, llm_replay, num, worker, write_chat_recording,
};

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// A listener that answers nothing and counts the connections and bytes it gets: where
/// nothing may arrive.
struct Elsewhere {
    addr: std::net::SocketAddr,
    connections: Arc<AtomicUsize>,
    bytes: Arc<AtomicUsize>,
}

impl Elsewhere {
    fn start() -> Elsewhere {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let bytes = Arc::new(AtomicUsize::new(0));
        let (seen, read) = (Arc::clone(&connections), Arc::clone(&bytes));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                seen.fetch_add(1, Ordering::SeqCst);
                let read = Arc::clone(&read);
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = stream.read(&mut buf) {
                        read.fetch_add(n, Ordering::SeqCst);
                    }
                });
            }
        });
        Elsewhere {
            addr,
            connections,
            bytes,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// (connections, bytes) received so far.
    fn received(&self) -> (usize, usize) {
        (
            self.connections.load(Ordering::SeqCst),
            self.bytes.load(Ordering::SeqCst),
        )
    }
}

/// Read one request (head and `Content-Length` body); `false` when the peer closed first.
fn read_request(reader: &mut impl BufRead) -> bool {
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

/// Answer every request on `stream` with `307 Location: {location}`, keeping it alive.
fn redirect_all(stream: impl Read + Write, location: &str, answered: &AtomicUsize) {
    let mut stream = BufReader::new(stream);
    let response = format!(
        "HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n"
    );
    while read_request(&mut stream) {
        answered.fetch_add(1, Ordering::SeqCst);
        if stream.get_mut().write_all(response.as_bytes()).is_err() {
            return;
        }
        let _ = stream.get_mut().flush();
    }
}

/// A target that answers every request with a 307 to `location`, over TLS when `tls` holds
/// its certificate chain and key; returns its port and the count of requests it answered.
fn redirecting_target(
    location: String,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let answered = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&answered);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { break };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let (location, count, tls) = (location.clone(), Arc::clone(&count), tls.clone());
            std::thread::spawn(move || match tls {
                Some(config) => {
                    let Ok(connection) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let tls_stream = rustls::StreamOwned::new(connection, stream);
                    redirect_all(tls_stream, &location, &count);
                }
                None => redirect_all(stream, &location, &count),
            });
        }
    });
    (port, answered)
}

/// A private CA (written as `ca.pem` in `dir`) and a server configuration for `localhost`
/// and 127.0.0.1 with a leaf it signed, speaking HTTP/1.1.
fn tls_server(dir: &TempDir) -> Arc<rustls::ServerConfig> {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "llm-replay redirect test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
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

/// Run `llm-replay ARGS... --report-json REPORT` with `env` added; its exit code, stdout
/// and stderr as text, and its report. (The exit code of a run where no request succeeded
/// is not these tests' concern.)
fn run_with_env(
    args: &[&str],
    env: &[(&str, &str)],
    report: &Path,
) -> (String, Option<serde_json::Value>) {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--report-json", path_str(report)]);
    let mut run = Spawned::start(&bin("llm-replay"), &all, env);
    let code = run.wait_timeout(Duration::from_secs(120));
    let output = format!(
        "exit {code:?}\nstdout:\n{}\nstderr:\n{}",
        run.stdout(),
        run.stderr()
    );
    assert!(code.is_some(), "the run did not end: {output}");
    let report = std::fs::read_to_string(report)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    (output, report)
}

/// The coordinator's probe of the target's `/metrics` got the 307 and said so in a note.
fn assert_scrape_redirect_noted(report: &serde_json::Value) {
    let note = report["server"]["endpoints"][0]["note"]
        .as_str()
        .unwrap_or_else(|| panic!("no note on the scrape: {:#}", report["server"]));
    assert!(note.contains("HTTP 307"), "{note}");
}

/// Every request of the run failed with status 307 and none succeeded.
fn assert_all_failed_with_307(report: &serde_json::Value, requests: f64) {
    assert_eq!(num(report, &["requests", "succeeded"]), 0.0, "{report:#}");
    assert_eq!(num(report, &["requests", "failed"]), requests, "{report:#}");
    assert_eq!(
        num(report, &["requests", "failed_by_kind", "status"]),
        requests,
        "{report:#}"
    );
    assert_eq!(
        num(report, &["requests", "status_codes", "307"]),
        requests,
        "{report:#}"
    );
}

#[test]
fn a_redirect_from_an_https_target_is_a_status_and_the_credentials_stay_home() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("redirect-https");
    let elsewhere = Elsewhere::start();
    let tls = tls_server(&dir);
    let (port, answered) = redirecting_target(
        format!("{}/v1/chat/completions", elsewhere.url()),
        Some(tls),
    );
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 4, 5, None);
    let target = format!("https://localhost:{port}");
    let (output, report) = run_with_env(
        &[
            "run",
            path_str(&recording),
            "--target",
            &target,
            "--target-ca",
            path_str(&dir.join("ca.pem")),
            "--schedule",
            "asap",
            "--concurrency",
            "1",
            "--header",
            "x-api-key: secret-x-api-key",
            "--header",
            "api-key: secret-api-key",
            "--header",
            "authorization: Bearer secret-bearer",
        ],
        &[],
        &dir.join("report.json"),
    );
    assert_eq!(elsewhere.received(), (0, 0), "the redirect was followed");
    // Four requests and the coordinator's probe of /metrics, whose 307 is not followed
    // either (the headers may carry credentials): a note, and no more scrapes.
    assert_eq!(answered.load(Ordering::SeqCst), 5, "{output}");
    let report = report.unwrap_or_else(|| panic!("no report: {output}"));
    assert_all_failed_with_307(&report, 4.0);
    assert_scrape_redirect_noted(&report);
    assert!(!output.contains("secret-"), "{output}");
}

#[test]
fn a_redirect_from_a_plain_http_target_is_the_same_status_on_either_client() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("redirect-http");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 3, 5, None);
    // The own HTTP/1.1 client, then reqwest (which SigV4 uses over http too).
    let sigv4_env = [
        ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
        ("AWS_SECRET_ACCESS_KEY", "secret-access-key"),
        ("AWS_SESSION_TOKEN", "secret-session-token"),
    ];
    for sigv4 in [false, true] {
        let elsewhere = Elsewhere::start();
        let (port, answered) =
            redirecting_target(format!("{}/v1/chat/completions", elsewhere.url()), None);
        let target = format!("http://127.0.0.1:{port}");
        let mut args = vec![
            "run",
            path_str(&recording),
            "--target",
            &target,
            "--schedule",
            "asap",
            "--concurrency",
            "1",
            "--header",
            "x-api-key: secret-x-api-key",
        ];
        let env: &[(&str, &str)] = if sigv4 {
            args.extend_from_slice(&["--aws-sigv4", "us-east-1"]);
            &sigv4_env
        } else {
            &[]
        };
        let report_path = dir.join(&format!("report-{sigv4}.json"));
        let (output, report) = run_with_env(&args, env, &report_path);
        assert_eq!(
            elsewhere.received(),
            (0, 0),
            "sigv4 {sigv4}: the redirect was followed"
        );
        // Three requests and the coordinator's probe of /metrics (not followed either).
        assert_eq!(
            answered.load(Ordering::SeqCst),
            4,
            "sigv4 {sigv4}: {output}"
        );
        let report = report.unwrap_or_else(|| panic!("sigv4 {sigv4}: no report: {output}"));
        assert_all_failed_with_307(&report, 3.0);
        assert_scrape_redirect_noted(&report);
    }
}

#[test]
fn a_control_character_in_a_header_value_is_a_usage_error_naming_the_header() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("header-control");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 2, 5, None);
    let target = Elsewhere::start();
    for value in ["b\u{1}c", "b\r\nx-injected: 1", "b\nc", "tab\tthen\u{7f}"] {
        let header = format!("x-secret-header: hunter2-{value}");
        let out = llm_replay(
            &[
                "run",
                path_str(&recording),
                "--target",
                &target.url(),
                "--header",
                &header,
            ],
            None,
        );
        assert_eq!(out.code, 2, "{value:?}: {}", out.stderr);
        assert!(out.stderr.contains("x-secret-header"), "{}", out.stderr);
        assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
        assert!(!out.stdout.contains("hunter2"), "{}", out.stdout);
    }
    assert_eq!(target.received(), (0, 0), "a request was sent");
}

#[test]
fn too_many_local_workers_is_a_usage_error_before_any_starts() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("workers-limit");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 2, 5, None);
    let target = Elsewhere::start();
    let mut run = Spawned::start(
        &bin("llm-replay"),
        &[
            "run",
            path_str(&recording),
            "--target",
            &target.url(),
            "--workers",
            "100000",
        ],
        &[],
    );
    let code = run.wait_timeout(Duration::from_secs(30));
    if code.is_none() {
        run.kill();
    }
    let stderr = run.stderr();
    assert_eq!(code, Some(2), "{stderr}");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let limit = (8 * cores).max(64);
    assert!(stderr.contains("--workers 100000"), "{stderr}");
    assert!(stderr.contains(&format!("at most {limit}")), "{stderr}");
    assert!(!stderr.contains("cannot start local worker"), "{stderr}");
    assert_eq!(target.received(), (0, 0), "a worker sent a request");
}

/// Descriptors a process holds.
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| dir.count())
}

/// GET /metrics; `None` when nothing answers.
fn scrape(addr: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.starts_with("HTTP/1.0 200").then_some(response)
}

/// The endpoint serves at most this many connections at once (`coordinator::live`).
const LIVE_CONNECTIONS: usize = 64;

/// The coordinator's descriptors in the flood test (`ulimit -n`).
const COORDINATOR_DESCRIPTORS: usize = 256;

/// The flood: one connection more than the coordinator has descriptors, so that an endpoint
/// without a cap runs out of them. Past the cap, connections wait in the listener's backlog
/// (129 here); the next one connects only when the endpoint drops a silent connection at its
/// head timeout (`coordinator::live::HEAD_TIMEOUT`, 5 s), and each 64 more cost another 5 s:
/// 257 connections take one such wait (400, as before, took four: 20 s of this test's 32).
const FLOOD: usize = COORDINATOR_DESCRIPTORS + 1;

#[test]
fn a_flood_of_silent_connections_on_metrics_listen_does_not_stop_the_run() {
    let _parallel = fixtures::parallel_lock();
    let mock = MockServer::start(&["--ttft", "2ms", "--itl", "1ms", "--tokens", "5"]);
    let dir = TempDir::new("metrics-flood");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 6, 5, None);
    let report_path = dir.join("report.json");
    let program = bin("llm-replay");
    // 256 descriptors for the coordinator; it waits for one remote worker, started once the
    // flood is on, so the worker's link and the flood compete for them.
    let mut run = Spawned::start(
        Path::new("/bin/sh"),
        &[
            "-c",
            &format!("ulimit -n {COORDINATOR_DESCRIPTORS} && exec \"$@\""),
            "sh",
            path_str(&program),
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--schedule",
            "asap",
            "--concurrency",
            "2",
            "--listen",
            "127.0.0.1:0",
            "--expect-workers",
            "1",
            "--join-timeout",
            "30s",
            "--metrics-listen",
            "127.0.0.1:0",
            // Long enough for the scrape after the flood closes (milliseconds), which waits
            // for the report; the test then waits for the linger to end.
            "--metrics-linger",
            "4s",
            "--report-json",
            path_str(&report_path),
        ],
        &[],
    );
    let (mut metrics, mut link) = (None, None);
    assert!(
        eventually(Duration::from_secs(30), || {
            let stderr = run.stderr();
            metrics = stderr.lines().find_map(|l| {
                let rest = l.split("live metrics on http://").nth(1)?;
                Some(rest.trim_end_matches("/metrics").to_owned())
            });
            link = stderr
                .lines()
                .find(|l| l.contains("waiting for"))
                .and_then(|l| l.split(" on ").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_owned);
            metrics.is_some() && link.is_some()
        }),
        "the coordinator did not start: {}",
        run.stderr()
    );
    let (metrics, link) = (metrics.expect("found above"), link.expect("found above"));
    let pid = run.child.id();
    let before = open_descriptors(pid);

    // Connections that send nothing, held open.
    let flood: Vec<TcpStream> = (0..FLOOD)
        .map_while(|_| TcpStream::connect(&metrics).ok())
        .collect();
    assert_eq!(
        flood.len(),
        FLOOD,
        "the endpoint stopped listening during the flood: {}",
        run.stderr()
    );
    // The coordinator takes its share of them (all it can, without a cap).
    assert!(
        eventually(Duration::from_secs(20), || open_descriptors(pid)
            >= before + LIVE_CONNECTIONS - 4),
        "{} descriptors (before the flood {before})",
        open_descriptors(pid)
    );
    let during = open_descriptors(pid);
    assert!(
        during <= before + LIVE_CONNECTIONS + 16,
        "{during} descriptors during the flood (before it {before}): the connections are not capped"
    );

    // The run goes on under the flood: the worker joins and the report is written.
    let mut member = worker(&link, "flooded", &[], &[]);
    let mut report = None;
    eventually(Duration::from_secs(60), || {
        report = std::fs::read_to_string(&report_path)
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok());
        report.is_some() || run.child.try_wait().ok().flatten().is_some()
    });
    let report = report.unwrap_or_else(|| {
        panic!(
            "no report under the flood; coordinator:\n{}\nworker:\n{}",
            run.stderr(),
            member.stderr()
        )
    });
    assert_eq!(num(&report, &["requests", "succeeded"]), 6.0, "{report:#}");

    // Once the flood closes, the endpoint answers (the final numbers, while it lingers).
    drop(flood);
    let mut text = None;
    assert!(
        eventually(Duration::from_secs(8), || {
            text = scrape(&metrics);
            text.is_some()
        }),
        "the endpoint does not answer after the flood: {}",
        run.stderr()
    );
    let text = text.expect("checked above");
    assert!(
        text.lines()
            .any(|l| l.starts_with("llm_replay_run_finished{") && l.ends_with(" 1")),
        "{text}"
    );
    assert_eq!(
        run.wait_timeout(Duration::from_secs(60)),
        Some(0),
        "{}",
        run.stderr()
    );
    assert_eq!(member.wait_timeout(Duration::from_secs(30)), Some(0));
    assert!(
        !run.stderr().contains("Too many open files"),
        "{}",
        run.stderr()
    );
}

#[test]
fn the_health_port_binds_the_address_it_is_given() {
    let _parallel = fixtures::parallel_lock();
    let free_port = || {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
    };
    // No coordinator answers: the worker keeps trying, and its health check answers meanwhile.
    let refused = fixtures::RefusedAddr::new();
    let nobody = refused.addr.to_string();
    let health = |port: u16| {
        let mut answer = String::new();
        let answered = eventually(Duration::from_secs(20), || {
            let Ok(mut socket) = TcpStream::connect(("127.0.0.1", port)) else {
                return false;
            };
            let _ = socket.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = socket.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n");
            answer.clear();
            let _ = socket.read_to_string(&mut answer);
            answer.contains("200 OK")
        });
        (answered, answer)
    };

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let loopback_only = worker(
        &nobody,
        "loopback-health",
        &["--health-port", &listen, "--connect-patience", "60s"],
        &[],
    );
    let (answered, answer) = health(port);
    assert!(answered, "{answer}\n{}", loopback_only.stderr());
    assert!(answer.contains("\"phase\""), "{answer}");
    // Bound to 127.0.0.1 alone: another loopback address may take the same port.
    TcpListener::bind(("127.0.0.2", port)).expect("the port is free on 127.0.0.2");

    // A bare port is every interface, as before.
    let port = free_port();
    let everywhere = worker(
        &nobody,
        "wildcard-health",
        &[
            "--health-port",
            &port.to_string(),
            "--connect-patience",
            "60s",
        ],
        &[],
    );
    let (answered, answer) = health(port);
    assert!(answered, "{answer}\n{}", everywhere.stderr());
    assert!(
        TcpListener::bind(("127.0.0.2", port)).is_err(),
        "a bare --health-port listens on every interface"
    );

    // Not an address: a usage error naming the flag.
    let mut bad = worker(&nobody, "bad-health", &["--health-port", "here:there"], &[]);
    assert_eq!(bad.wait_timeout(Duration::from_secs(20)), Some(2));
    assert!(bad.stderr().contains("--health-port"), "{}", bad.stderr());
}
