//! `llm-replay record` in front of upstreams that drop connections, on real sockets: a
//! server that closes each kept-alive connection after its streamed response, as llama.cpp's
//! does (the proxy resends a request whose reused connection closed before any response
//! byte, once, on a new connection: every client request succeeds and is recorded once), and
//! upstreams that cannot be reached or answer nothing (the client's 502 or 504 names the
//! cause and the upstream, and so does the recorded exchange; a request that failed on a new
//! connection is never sent again).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fixtures::{Spawned, TempDir, bin, eventually};
use serde_json::Value;

/// How the raw upstream treats each connection.
#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    /// Answer one streamed request (HTTP/1.1, keep-alive advertised on every other
    /// connection, never `Connection: close`), then close the connection. Which close, by
    /// connection: at once after the last chunk (llama.cpp); when the next request's first
    /// bytes arrive, without reading them (a reset: the request was written on a connection
    /// the pool had already picked); or after reading the next request whole (a clean close,
    /// no answer).
    ClosesAfterEachResponse,
    /// Read the request whole, then close without a byte of response.
    ClosesBeforeResponse,
    /// Wait for the request's first bytes, then close without reading them (a reset).
    ResetsOnRequest,
    /// Read the request and say nothing (the connection held open).
    Silent,
}

/// What the upstream saw.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    /// Requests read whole.
    requests: AtomicUsize,
    /// Requests answered with a whole response.
    answered: AtomicUsize,
    /// Requests that arrived on a connection and got a close (read or not).
    dropped: AtomicUsize,
}

/// Start a raw HTTP/1.1 upstream on 127.0.0.1:0; returns its URL and what it sees.
fn start_upstream(behaviour: Behaviour) -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(Seen::default());
    let counters = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { break };
            let index = counters.connections.fetch_add(1, Ordering::SeqCst);
            let counters = counters.clone();
            std::thread::spawn(move || {
                let _ = serve(stream, behaviour, index, &counters);
            });
        }
    });
    (url, seen)
}

/// Read one request (head and `content-length` body); `None` when the peer closed first.
fn read_request(reader: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut content_length = 0usize;
    let mut line = String::new();
    let mut first = true;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return if first {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
        first = false;
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
    Ok(Some(String::from_utf8_lossy(&body).into_owned()))
}

/// Wait until the peer sends something (true) or closes (false), reading nothing.
fn request_arrives(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.peek(&mut byte), Ok(n) if n > 0)
}

fn serve(
    stream: TcpStream,
    behaviour: Behaviour,
    index: usize,
    seen: &Seen,
) -> std::io::Result<()> {
    // A connection the proxy keeps idle and never uses again ends here.
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    if behaviour == Behaviour::ResetsOnRequest {
        if request_arrives(&stream) {
            seen.dropped.fetch_add(1, Ordering::SeqCst);
        }
        // Dropped with the request unread: the kernel answers with a reset.
        return Ok(());
    }
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream.try_clone()?;
    let Some(body) = read_request(&mut reader)? else {
        return Ok(());
    };
    seen.requests.fetch_add(1, Ordering::SeqCst);
    match behaviour {
        Behaviour::ClosesBeforeResponse => {
            seen.dropped.fetch_add(1, Ordering::SeqCst);
            return Ok(());
        }
        Behaviour::Silent => {
            let mut sink = [0u8; 1024];
            while reader.read(&mut sink).is_ok_and(|n| n > 0) {}
            return Ok(());
        }
        Behaviour::ClosesAfterEachResponse | Behaviour::ResetsOnRequest => {}
    }
    // "question 17" in the request: "answer to question 17" in the response.
    let question = body
        .split("question ")
        .nth(1)
        .map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .unwrap_or_default();
    let keep_alive = if index.is_multiple_of(2) {
        "Connection: keep-alive\r\nKeep-Alive: timeout=5, max=100\r\n"
    } else {
        ""
    };
    writer.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
             {keep_alive}Transfer-Encoding: chunked\r\n\r\n"
        )
        .as_bytes(),
    )?;
    let events = [
        r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#.to_owned(),
        format!(
            r#"{{"choices":[{{"index":0,"delta":{{"content":"answer to question {question}"}}}}]}}"#
        ),
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#.to_owned(),
        "[DONE]".to_owned(),
    ];
    for event in events {
        let frame = format!("data: {event}\n\n");
        writer.write_all(format!("{:x}\r\n{frame}\r\n", frame.len()).as_bytes())?;
        writer.flush()?;
    }
    writer.write_all(b"0\r\n\r\n")?;
    writer.flush()?;
    seen.answered.fetch_add(1, Ordering::SeqCst);
    match index % 3 {
        // llama.cpp: closed right after the response.
        0 => Ok(()),
        // Closed when the next request arrives, unread: a reset.
        1 => {
            if request_arrives(&stream) {
                seen.dropped.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }
        // The next request read whole, then closed without a byte of answer.
        _ => {
            if read_request(&mut reader).is_ok_and(|r| r.is_some()) {
                seen.requests.fetch_add(1, Ordering::SeqCst);
                seen.dropped.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }
    }
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

fn chat(question: usize) -> String {
    format!(
        r#"{{"model":"llama","stream":true,"max_tokens":8,"messages":[{{"role":"user","content":"question {question}"}}]}}"#
    )
}

/// One request through the proxy: status and the whole body (or the transport error).
async fn ask(client: &reqwest::Client, url: &str, question: usize) -> (u16, String) {
    let response = match client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat(question))
        .send()
        .await
    {
        Ok(response) => response,
        Err(error) => return (0, format!("no response: {error}")),
    };
    let status = response.status().as_u16();
    match response.text().await {
        Ok(text) => (status, text),
        Err(error) => (status, format!("body cut: {error}")),
    }
}

#[test]
fn an_upstream_closing_each_connection_after_its_stream_costs_clients_nothing() {
    let _parallel = fixtures::parallel_lock();
    const REQUESTS: usize = 100;
    const CONCURRENCY: usize = 8;
    let (upstream, seen) = start_upstream(Behaviour::ClosesAfterEachResponse);
    let dir = TempDir::new("capture-upstream-closes");
    let out = dir.join("recorded.jsonl");
    let (mut recorder, url) = start_recorder(&upstream, &out, &[]);
    let outcomes = runtime().block_on(async {
        let client = reqwest::Client::new();
        let next = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..CONCURRENCY {
            let (client, url, next) = (client.clone(), url.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                let mut outcomes = Vec::new();
                loop {
                    let question = next.fetch_add(1, Ordering::SeqCst);
                    if question >= REQUESTS {
                        break outcomes;
                    }
                    let (status, body) = ask(&client, &url, question).await;
                    outcomes.push((question, status, body));
                }
            }));
        }
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.extend(task.await.expect("client task"));
        }
        outcomes
    });
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(question, status, body)| {
            *status != 200
                || !body.contains(&format!("answer to question {question}\""))
                || !body.contains("data: [DONE]")
        })
        .map(|(question, status, body)| format!("question {question}: {status} {body:.200}"))
        .collect();
    let dropped = seen.dropped.load(Ordering::SeqCst);
    eprintln!(
        "{} of {REQUESTS} requests failed; the upstream opened {} connections, answered {} \
         requests and closed {dropped} connections on a request",
        failed.len(),
        seen.connections.load(Ordering::SeqCst),
        seen.answered.load(Ordering::SeqCst),
    );
    assert!(
        failed.is_empty(),
        "{} of {REQUESTS} requests failed through the proxy:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert_eq!(outcomes.len(), REQUESTS);
    // The upstream really dropped requests on reused connections: the test tested something.
    assert!(dropped > 0, "the upstream never closed on a request");
    // Each request was answered once: a resend only ever follows a request that got nothing.
    assert_eq!(seen.answered.load(Ordering::SeqCst), REQUESTS);

    assert_eq!(terminate(&mut recorder), 0, "{}", recorder.stderr());
    let stderr = recorder.stderr();
    // The proxy says how many requests it resent, and it is at least every request the
    // upstream dropped (a reset can also come from the kernel, before the server saw it).
    let resent: usize = stderr
        .lines()
        .find_map(|line| {
            let at = line.find(" requests resent")?;
            line[..at]
                .rsplit(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no resend count in the proxy's output:\n{stderr}"));
    eprintln!("the proxy resent {resent} requests");
    assert!(
        resent >= dropped,
        "resent {resent}, the upstream dropped {dropped}: {stderr}"
    );

    let lines = recorded_lines(&out);
    assert_eq!(lines.len(), REQUESTS, "one recorded exchange per request");
    let mut questions: Vec<usize> = lines
        .iter()
        .map(|exchange| {
            let body = exchange["request"]["body"].as_str().expect("a text body");
            let question: usize = body
                .split("question ")
                .nth(1)
                .and_then(|rest| {
                    rest.chars()
                        .take_while(char::is_ascii_digit)
                        .collect::<String>()
                        .parse()
                        .ok()
                })
                .expect("the question in the recorded request");
            let response = &exchange["response"];
            assert_eq!(response["status"].as_u64(), Some(200), "{exchange}");
            assert_eq!(response["complete"], Value::Bool(true), "{exchange}");
            let text: String = response["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .filter_map(|frame| frame["data"].as_str())
                .collect();
            assert!(
                text.contains(&format!("answer to question {question}\"")),
                "{exchange}"
            );
            assert!(exchange.get("error").is_none(), "{exchange}");
            question
        })
        .collect();
    questions.sort_unstable();
    assert_eq!(
        questions,
        (0..REQUESTS).collect::<Vec<_>>(),
        "every request recorded exactly once"
    );
}

/// Send `count` requests one after the other; returns each status and body.
fn ask_sequentially(url: &str, count: usize) -> Vec<(u16, String)> {
    runtime().block_on(async {
        let client = reqwest::Client::new();
        let mut answers = Vec::new();
        for question in 0..count {
            answers.push(ask(&client, url, question).await);
        }
        answers
    })
}

#[test]
fn an_unreachable_upstream_gets_a_502_naming_the_cause_and_the_upstream() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("capture-upstream-unreachable");

    // Nothing listens on the port.
    let refused = {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", listener.local_addr().expect("addr"))
    };
    // Closes every connection once the request arrived, without a byte of response; every
    // connection is new, so nothing may be sent twice.
    let (closing, closing_seen) = start_upstream(Behaviour::ClosesBeforeResponse);
    // Resets every connection when the request arrives.
    let (resetting, resetting_seen) = start_upstream(Behaviour::ResetsOnRequest);

    for (upstream, cause, seen) in [
        (&refused, "connection refused", None),
        (
            &closing,
            "closed the connection before a response",
            Some(&closing_seen),
        ),
        (
            &resetting,
            "reset the connection before a response",
            Some(&resetting_seen),
        ),
    ] {
        let out = dir.join("recorded.jsonl");
        let (mut recorder, url) = start_recorder(upstream, &out, &[]);
        let answers = ask_sequentially(&url, 3);
        let address = upstream.trim_start_matches("http://");
        for (status, body) in &answers {
            assert_eq!(*status, 502, "{upstream}: {body}");
            assert!(
                body.contains(cause) && body.contains(address),
                "{upstream}: the 502 must name {cause:?} and {address}: {body:?}"
            );
        }
        if let Some(seen) = seen {
            // A request that failed on a new connection is not sent again.
            assert_eq!(
                seen.dropped.load(Ordering::SeqCst),
                3,
                "{upstream}: each request reached the upstream once"
            );
        }
        assert_eq!(terminate(&mut recorder), 0, "{}", recorder.stderr());
        let lines = recorded_lines(&out);
        assert_eq!(lines.len(), 3);
        for exchange in &lines {
            assert!(
                exchange.get("response").is_none_or(Value::is_null),
                "{exchange}"
            );
            let error = exchange["error"].as_str().expect("an error");
            assert!(
                error.contains(cause) && error.contains(address),
                "{upstream}: the recorded error must name {cause:?} and {address}: {error:?}"
            );
        }
    }
}

#[test]
fn a_silent_upstream_gets_a_504_naming_the_upstream_and_the_wait() {
    let _parallel = fixtures::parallel_lock();
    let (upstream, seen) = start_upstream(Behaviour::Silent);
    let dir = TempDir::new("capture-upstream-silent");
    let out = dir.join("recorded.jsonl");
    let (mut recorder, url) = start_recorder(&upstream, &out, &["--upstream-idle-timeout", "1s"]);
    let answers = ask_sequentially(&url, 1);
    let (status, body) = &answers[0];
    assert_eq!(*status, 504, "{body}");
    let address = upstream.trim_start_matches("http://");
    assert!(
        body.contains(address) && body.contains("within 1s"),
        "the 504 must name {address} and the wait: {body:?}"
    );
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1, "sent once");
    assert_eq!(terminate(&mut recorder), 0, "{}", recorder.stderr());
    let lines = recorded_lines(&out);
    assert_eq!(lines.len(), 1);
    let error = lines[0]["error"].as_str().expect("an error");
    assert!(error.contains("no response headers within 1s"), "{error}");
}
