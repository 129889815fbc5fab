//! The resend rule (issue 31, item 11) and the worker's log (item 12), with real processes on
//! loopback.
//!
//! A request is sent a second time only when the connection it was written to had carried an
//! earlier request to its response (a keep-alive connection the server was closing) and
//! closed before any byte of this one's response. On a connection opened for the request, or
//! pre-opened for the run, the server may have read it: the request fails with its cause and
//! the server sees it once. Both transports: the own HTTP/1.1 client (`http://`) and reqwest
//! (`https://`).
//!
//! The worker's stderr, written to a file, holds no colour codes and no event twice.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fixtures::{TempDir, bin, eventually, llm_replay, num, write_chat_recording};

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// What the server does with the n-th replayed request on one connection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// A whole chat stream, the connection kept alive.
    Answer,
    /// Close the connection, the request read and not a byte answered.
    Close,
}

/// A target on 127.0.0.1:0, over TLS when `tls` is given, that replies to the replayed
/// requests on each connection as `script` says (the last entry for every later request) and
/// answers the coordinator's `GET /metrics` with a 404. It counts the replayed requests it
/// read, by exchange (the recording's "Question number N").
struct ScriptedTarget {
    port: u16,
    seen: Arc<Mutex<BTreeMap<usize, usize>>>,
}

impl ScriptedTarget {
    fn start(script: &'static [Reply], tls: Option<Arc<rustls::ServerConfig>>) -> ScriptedTarget {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let counts = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(20)));
                let (counts, tls) = (Arc::clone(&counts), tls.clone());
                std::thread::spawn(move || match tls {
                    Some(config) => {
                        let Ok(connection) = rustls::ServerConnection::new(config) else {
                            return;
                        };
                        serve(
                            rustls::StreamOwned::new(connection, stream),
                            script,
                            &counts,
                        );
                    }
                    None => serve(stream, script, &counts),
                });
            }
        });
        ScriptedTarget { port, seen }
    }

    /// How many times the server read each exchange.
    fn seen(&self) -> BTreeMap<usize, usize> {
        self.seen.lock().expect("counts lock").clone()
    }
}

/// The chat stream of every answer: chunked, no `Connection: close`.
const SSE_EVENTS: [&str; 4] = [
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
];

/// One connection of the scripted target.
fn serve(stream: impl Read + Write, script: &[Reply], seen: &Mutex<BTreeMap<usize, usize>>) {
    let mut stream = BufReader::new(stream);
    let mut replayed = 0usize;
    while let Some((request_line, body)) = read_request(&mut stream) {
        let response = if request_line.starts_with("GET /metrics") {
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_owned()
        } else {
            let exchange = body
                .split("Question number ")
                .nth(1)
                .and_then(|rest| rest.split(':').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(usize::MAX);
            *seen
                .lock()
                .expect("counts lock")
                .entry(exchange)
                .or_default() += 1;
            let reply = script[replayed.min(script.len() - 1)];
            replayed += 1;
            if reply == Reply::Close {
                // Read, never answered: the connection ends here.
                return;
            }
            let mut response = String::from(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
            );
            for event in SSE_EVENTS {
                response.push_str(&format!("{:x}\r\n{event}\r\n", event.len()));
            }
            response.push_str("0\r\n\r\n");
            response
        };
        let writer = stream.get_mut();
        if writer.write_all(response.as_bytes()).is_err() || writer.flush().is_err() {
            return;
        }
    }
}

/// Read one request: its request line and its `Content-Length` body; `None` when the peer
/// closed first.
fn read_request(reader: &mut impl BufRead) -> Option<(String, String)> {
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).ok()? == 0 {
        return None;
    }
    let mut content_length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            content_length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; content_length];
    reader.read_exact(&mut body).ok()?;
    Some((request_line, String::from_utf8_lossy(&body).into_owned()))
}

/// A private CA (written as `ca.pem` in `dir`) and a server configuration for `localhost`
/// with a leaf it signed, speaking HTTP/1.1 only (reqwest's HTTP/1.1 path).
fn tls_server(dir: &TempDir) -> Arc<rustls::ServerConfig> {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "llm-replay resend test CA");
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

/// Replay `requests` chat requests one at a time (one worker, concurrency 1: one connection
/// opened ahead) against a scripted target, in cleartext or over TLS; the target and the run.
fn replay_against(
    script: &'static [Reply],
    tls: bool,
    requests: usize,
) -> (ScriptedTarget, fixtures::RunOutput) {
    let dir = TempDir::new("resend-rule");
    let config = tls.then(|| tls_server(&dir));
    let target = ScriptedTarget::start(script, config);
    let url = if tls {
        format!("https://localhost:{}", target.port)
    } else {
        format!("http://127.0.0.1:{}", target.port)
    };
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, requests, 5, None);
    let ca = dir.join("ca.pem");
    let mut args = vec![
        "run",
        path_str(&recording),
        "--target",
        &url,
        "--schedule",
        "asap",
        "--concurrency",
        "1",
        "--workers",
        "1",
    ];
    if tls {
        args.extend(["--target-ca", path_str(&ca)]);
    }
    let out = llm_replay(&args, Some(&dir.join("report.json")));
    (target, out)
}

/// Issue 31, item 11: the server reads each request on a connection no response came back
/// on — the one opened ahead of the run for the first, a new one for each after — and closes
/// it without answering. It may have acted on the request, so none is sent again: each is
/// read exactly once, and fails as closed before a response. Over the own HTTP/1.1 client
/// and over reqwest (TLS). Before the rule, each was sent twice.
#[test]
fn a_request_whose_new_connection_closes_after_the_write_fails_and_is_not_resent() {
    let _parallel = fixtures::parallel_lock();
    for tls in [false, true] {
        let (target, out) = replay_against(&[Reply::Close], tls, 3);
        let context = format!(
            "tls {tls}\nexit {}\nstdout:\n{}\nstderr:\n{}",
            out.code, out.stdout, out.stderr
        );
        assert_eq!(out.code, 3, "every request failed: {context}");
        let report = out.report.expect("report JSON");
        assert_eq!(num(&report, &["requests", "failed"]), 3.0, "{context}");
        let kind = &report["requests"]["failed_by_kind"];
        assert_eq!(kind["transport"], 3, "{context}");
        assert_eq!(
            kind["transport_causes"]["closed_before_response"], 3,
            "{context}"
        );
        assert_eq!(num(&report, &["requests", "resent"]), 0.0, "{context}");
        assert!(!out.stdout.contains("resent"), "{context}");
        assert_eq!(
            target.seen(),
            BTreeMap::from([(0, 1), (1, 1), (2, 1)]),
            "each request read once: {context}"
        );
    }
}

/// The other side of the rule: a keep-alive connection that answered the first request reads
/// the second and closes without a byte (as llama.cpp's server does). The server did not take
/// it: the second is sent once more on a fresh connection, which answers. Both succeed, the
/// second was read twice, one request is counted as resent. Over both transports.
#[test]
fn a_request_whose_reused_connection_closes_before_any_byte_is_resent_once() {
    let _parallel = fixtures::parallel_lock();
    for tls in [false, true] {
        let (target, out) = replay_against(&[Reply::Answer, Reply::Close], tls, 2);
        let context = format!(
            "tls {tls}\nexit {}\nstdout:\n{}\nstderr:\n{}",
            out.code, out.stdout, out.stderr
        );
        assert_eq!(out.code, 0, "{context}");
        let report = out.report.expect("report JSON");
        assert_eq!(num(&report, &["requests", "succeeded"]), 2.0, "{context}");
        assert_eq!(num(&report, &["requests", "failed"]), 0.0, "{context}");
        assert_eq!(num(&report, &["requests", "resent"]), 1.0, "{context}");
        assert!(out.stdout.contains("resent"), "{context}");
        assert_eq!(
            target.seen(),
            BTreeMap::from([(0, 1), (1, 2)]),
            "the second request read twice: {context}"
        );
    }
}

/// Issue 31, item 12: a worker whose stderr is a file (a container's or CI's log) writes no
/// colour codes, even with every debug event on, and says why it stopped on one line, once. Both
/// binaries: `llm-replay-worker` and `llm-replay worker`. The coordinator waits for a second
/// worker that never comes, and is killed while this one waits for its start.
#[test]
fn a_worker_logging_to_a_file_writes_no_colour_codes_and_no_event_twice() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("worker-log");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 4, 5, None);
    for (program, first_args) in [
        (bin("llm-replay-worker"), vec![]),
        (bin("llm-replay"), vec!["worker"]),
    ] {
        let (mut coordinator, addr) =
            fixtures::coordinator(&[path_str(&recording), "--schedule", "asap"], 2, &[]);
        let log_path = dir.join("worker-stderr.log");
        let log = std::fs::File::create(&log_path).expect("create the log file");
        let mut args = first_args.clone();
        args.extend([
            "--coordinator",
            addr.as_str(),
            "--once",
            "--worker-id",
            "w1",
            "--heartbeat-timeout",
            "1s",
        ]);
        let mut worker = Command::new(&program)
            .args(&args)
            .env("LLM_REPLAY_LOG", "debug")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("the worker starts");
        let mut stdout = BufReader::new(worker.stdout.take().expect("piped stdout"));
        let mut ready = String::new();
        let _ = stdout.read_line(&mut ready);
        let context = |what: &str| format!("{} {args:?}: {what}", program.display());
        assert!(ready.contains("joined run"), "{}", context(&ready));
        coordinator.kill();
        let mut status = None;
        assert!(
            eventually(Duration::from_secs(30), || {
                status = worker.try_wait().ok().flatten();
                status.is_some()
            }),
            "{}",
            context("the worker did not stop")
        );
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(3),
            "{}",
            context("exit")
        );
        let bytes = std::fs::read(&log_path).expect("the worker's stderr");
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.contains("DEBUG"),
            "{}",
            context(&format!("no debug event logged:\n{text}"))
        );
        assert!(
            !bytes.contains(&0x1b),
            "{}",
            context(&format!("colour codes in a file:\n{text}"))
        );
        // Why it stopped (the coordinator went away; or its slice stream broke, whichever
        // the worker noticed first): one line.
        let stopped: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("llm-replay-worker: "))
            .collect();
        assert_eq!(
            stopped.len(),
            1,
            "{}",
            context(&format!("why it stopped, said once:\n{text}"))
        );
    }
}
