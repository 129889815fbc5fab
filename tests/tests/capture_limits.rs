//! `llm-replay record` under hostile conditions, on real sockets: a huge response (memory
//! stays bounded, the client gets every byte, the recording keeps a marked prefix), an
//! upstream that goes silent (the response is cut and recorded incomplete), and a recording
//! that cannot be written (`/dev/full`: said at once, then `503`, non-zero exit).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use fixtures::{MockServer, Spawned, TempDir, bin, eventually};
use serde_json::Value;

/// How the raw upstream answers every request.
#[derive(Clone, Copy)]
enum Upstream {
    /// A chunked `text/plain` body of this many bytes, 64 KiB per chunk, generated as written.
    Huge(usize),
    /// Headers and one SSE chunk, then nothing (the connection held open).
    SilentAfterOneChunk,
    /// Nothing at all: not even the response headers.
    SilentBeforeHeaders,
}

/// Start a raw HTTP/1.1 upstream on 127.0.0.1:0; returns its URL.
fn start_upstream(behaviour: Upstream) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { break };
            std::thread::spawn(move || {
                let _ = serve(stream, behaviour);
            });
        }
    });
    url
}

fn serve(stream: TcpStream, behaviour: Upstream) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut content_length = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
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
    let mut body = vec![0; content_length];
    reader.read_exact(&mut body)?;
    match behaviour {
        Upstream::Huge(total) => {
            writer.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
            )?;
            let block = vec![b'x'; 64 << 10];
            let mut left = total;
            while left > 0 {
                let n = left.min(block.len());
                writer.write_all(format!("{n:x}\r\n").as_bytes())?;
                writer.write_all(&block[..n])?;
                writer.write_all(b"\r\n")?;
                left -= n;
            }
            writer.write_all(b"0\r\n\r\n")?;
            writer.flush()
        }
        Upstream::SilentAfterOneChunk => {
            let data = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
            writer.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{data}\r\n",
                    data.len()
                )
                .as_bytes(),
            )?;
            writer.flush()?;
            hold_until_closed(&mut reader)
        }
        Upstream::SilentBeforeHeaders => hold_until_closed(&mut reader),
    }
}

/// Say nothing until the peer closes the connection.
fn hold_until_closed(reader: &mut impl Read) -> std::io::Result<()> {
    let mut sink = [0u8; 1024];
    while reader.read(&mut sink)? > 0 {}
    Ok(())
}

/// Start `llm-replay record` in front of `upstream`; returns it and its URL.
fn start_recorder(upstream: &str, out: &Path, extra: &[&str]) -> (Spawned, String) {
    let out = out.to_str().expect("utf-8 path");
    let mut args = vec![
        "record",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--out",
        out,
    ];
    args.extend_from_slice(extra);
    let recorder = Spawned::start(&bin("llm-replay"), &args, &[]);
    let mut url = None;
    assert!(
        eventually(Duration::from_secs(30), || {
            url = recorder
                .stdout()
                .lines()
                .find_map(|l| l.strip_prefix("llm-replay record listening on "))
                .map(str::to_owned);
            url.is_some()
        }),
        "record did not start: {}",
        recorder.stderr()
    );
    (recorder, url.expect("checked above"))
}

/// SIGTERM and the exit code.
fn terminate(recorder: &mut Spawned) -> i32 {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &recorder.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    recorder
        .wait_timeout(Duration::from_secs(30))
        .expect("record exits after SIGTERM")
}

/// `VmHWM` (peak resident set) of a process, in MB.
fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kb / 1024.0
}

fn recorded_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("recording readable")
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

const CHAT: &str = r#"{"model":"mock-model","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn a_200_mb_response_passes_whole_with_bounded_memory_and_a_truncated_record() {
    // Heavy in memory, timed by nothing.
    let _parallel = fixtures::parallel_lock();
    const TOTAL: usize = 200 << 20;
    let upstream = start_upstream(Upstream::Huge(TOTAL));
    let dir = TempDir::new("capture-huge");
    let out = dir.join("recorded.jsonl");
    // The default cap (16 MiB).
    let (mut recorder, url) = start_recorder(&upstream, &out, &[]);
    let pid = recorder.child.id();
    let before_mb = peak_rss_mb(pid);
    let received = runtime().block_on(async {
        let mut response = reqwest::Client::new()
            .post(format!("{url}/v1/completions"))
            .header("content-type", "application/json")
            .body(CHAT)
            .send()
            .await
            .expect("request through the proxy");
        assert_eq!(response.status(), 200);
        let mut received = 0usize;
        let mut wrong = 0usize;
        while let Some(chunk) = response.chunk().await.expect("the body streams to its end") {
            received += chunk.len();
            wrong += chunk.iter().filter(|b| **b != b'x').count();
        }
        assert_eq!(wrong, 0, "the body arrived unchanged");
        received
    });
    assert_eq!(received, TOTAL, "the client got every byte");
    assert!(
        eventually(Duration::from_secs(10), || std::fs::metadata(&out)
            .is_ok_and(|m| m.len() > 0)),
        "the exchange was written"
    );
    let peak_mb = peak_rss_mb(pid);
    eprintln!(
        "record peak RSS: {before_mb:.1} MB at start, {peak_mb:.1} MB after a {} MB response",
        TOTAL >> 20
    );
    assert!(peak_mb < 100.0, "record peak RSS {peak_mb:.1} MB");
    assert_eq!(terminate(&mut recorder), 0, "{}", recorder.stderr());

    let size = std::fs::metadata(&out).expect("recording").len();
    assert!(size < 24 << 20, "recorded line is {size} bytes");
    let lines = recorded_lines(&out);
    assert_eq!(lines.len(), 1);
    let response = &lines[0]["response"];
    assert_eq!(
        response["truncated"],
        Value::Bool(true),
        "{:.300}",
        lines[0]
    );
    assert_eq!(response["complete"], Value::Bool(false));
    assert_eq!(response["body_bytes"].as_u64(), Some(TOTAL as u64));
    let kept: usize = response["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| f["data"].as_str().expect("text frame").len())
        .sum();
    assert_eq!(response["recorded_bytes"].as_u64(), Some(kept as u64));
    assert!(
        kept > (15 << 20) && kept <= 16 << 20,
        "kept {kept} bytes of frames under the 16 MiB cap"
    );
}

#[test]
fn max_recorded_bytes_takes_a_size_with_a_unit() {
    let _parallel = fixtures::parallel_lock();
    let upstream = start_upstream(Upstream::Huge(1 << 20));
    let dir = TempDir::new("capture-cap");
    let out = dir.join("recorded.jsonl");
    let (mut recorder, url) = start_recorder(&upstream, &out, &["--max-recorded-bytes", "100KiB"]);
    let received = runtime().block_on(async {
        let response = reqwest::Client::new()
            .post(format!("{url}/v1/completions"))
            .body(CHAT)
            .send()
            .await
            .expect("request through the proxy");
        response.bytes().await.expect("whole body").len()
    });
    assert_eq!(received, 1 << 20);
    assert_eq!(terminate(&mut recorder), 0, "{}", recorder.stderr());
    let lines = recorded_lines(&out);
    let response = &lines[0]["response"];
    assert_eq!(response["truncated"], Value::Bool(true));
    let kept = response["recorded_bytes"].as_u64().expect("recorded_bytes");
    assert!(kept <= 100 << 10 && kept > 0, "kept {kept}");

    let bad = fixtures::llm_replay(
        &[
            "record",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &upstream,
            "--out",
            out.to_str().expect("utf-8"),
            "--max-recorded-bytes",
            "16 parsecs",
        ],
        None,
    );
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(
        bad.stderr.contains("--max-recorded-bytes"),
        "{}",
        bad.stderr
    );
}

#[test]
fn a_silent_upstream_is_cut_at_the_idle_timeout_and_recorded_incomplete() {
    let _parallel = fixtures::parallel_lock();
    let upstream = start_upstream(Upstream::SilentAfterOneChunk);
    let dir = TempDir::new("capture-idle");
    let out = dir.join("recorded.jsonl");
    let (mut recorder, url) = start_recorder(&upstream, &out, &["--upstream-idle-timeout", "1s"]);
    let started = Instant::now();
    let (status, first, ended_cleanly) = runtime().block_on(async {
        let mut response = reqwest::Client::new()
            .post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(CHAT)
            .send()
            .await
            .expect("response headers through the proxy");
        let status = response.status();
        let mut body = Vec::new();
        let ended_cleanly = loop {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break true,
                Err(_) => break false,
            }
        };
        (
            status,
            String::from_utf8_lossy(&body).into_owned(),
            ended_cleanly,
        )
    });
    let took = started.elapsed();
    eprintln!("silent upstream: the client's response ended after {took:?}");
    assert_eq!(status, 200);
    assert!(
        first.starts_with("data: "),
        "the first chunk got through: {first:?}"
    );
    assert!(
        !ended_cleanly,
        "a cut response must not look complete to the client"
    );
    assert!(
        took < Duration::from_secs(10),
        "the response ended after {took:?}"
    );
    assert_eq!(terminate(&mut recorder), 0, "{}", recorder.stderr());

    let lines = recorded_lines(&out);
    assert_eq!(lines.len(), 1);
    let response = &lines[0]["response"];
    assert_eq!(response["complete"], Value::Bool(false), "{}", lines[0]);
    let ended = response["ended"].as_str().expect("a reason");
    assert!(ended.contains("idle"), "reason {ended:?}");
    assert_eq!(response["frames"].as_array().map(Vec::len), Some(1));
}

#[test]
fn an_upstream_without_headers_gets_504_at_the_idle_timeout() {
    let _parallel = fixtures::parallel_lock();
    let upstream = start_upstream(Upstream::SilentBeforeHeaders);
    let dir = TempDir::new("capture-no-headers");
    let out = dir.join("recorded.jsonl");
    let (mut recorder, url) = start_recorder(&upstream, &out, &["--upstream-idle-timeout", "1s"]);
    let started = Instant::now();
    let status = runtime().block_on(async {
        reqwest::Client::new()
            .post(format!("{url}/v1/chat/completions"))
            .body(CHAT)
            .send()
            .await
            .expect("an answer from the proxy")
            .status()
    });
    let took = started.elapsed();
    assert_eq!(status, 504);
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
    assert_eq!(terminate(&mut recorder), 0, "{}", recorder.stderr());
    let lines = recorded_lines(&out);
    assert_eq!(lines.len(), 1);
    assert!(lines[0].get("response").is_none_or(Value::is_null));
    let error = lines[0]["error"].as_str().expect("an error");
    assert!(error.contains("no response headers"), "{error}");
}

#[test]
fn a_recording_that_cannot_be_written_is_reported_at_once_then_503() {
    let _parallel = fixtures::parallel_lock();
    let full = Path::new("/dev/full");
    assert!(full.exists(), "this test needs Linux's /dev/full");
    let mock = MockServer::start(&["--ttft", "0ms", "--itl", "0ms", "--tokens", "2"]);
    let (mut recorder, url) = start_recorder(&mock.url, full, &["--on-record-error", "refuse"]);
    let rt = runtime();
    let client = reqwest::Client::new();
    let send = |i: usize| {
        rt.block_on(async {
            let response = client
                .post(format!("{url}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(CHAT.replace("hi", &format!("question {i}")))
                .send()
                .await
                .expect("an answer from the proxy");
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        })
    };
    // The first exchange goes through; writing it fails (ENOSPC).
    let (first, _) = send(1);
    assert_eq!(first, 200);
    assert!(
        eventually(Duration::from_secs(10), || recorder
            .stderr()
            .contains("cannot write")),
        "stderr did not name the write error while running: {}",
        recorder.stderr()
    );
    assert!(
        recorder.child.try_wait().expect("status").is_none(),
        "still running"
    );
    let stderr = recorder.stderr();
    assert!(stderr.contains("/dev/full"), "{stderr}");
    // From now on every request is refused, naming the cause.
    for i in 2..=3 {
        let (status, body) = send(i);
        assert_eq!(status, 503, "request {i}: {body}");
        assert!(body.contains("cannot be written"), "{body}");
        assert!(body.contains("No space left"), "{body}");
    }
    let code = terminate(&mut recorder);
    // exit::RUN_FAILED, with the cause on stderr again.
    assert_eq!(
        code,
        3,
        "exit code after a write error; stderr:\n{}",
        recorder.stderr()
    );
}
