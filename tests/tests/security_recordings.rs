//! Issue 18 (security, second review), recordings: credentials never reach a recording, a
//! replayed request or a report (query parameters matched after percent-decoding, headers by
//! their credential words), and whatever `record` writes stays readable (a 12 MiB body of
//! control bytes, 75.5 MB of escaped JSON, is stored cut and marked; a line over the
//! readers' cap is skipped with a warning naming it, not fatal to the whole recording).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use fixtures::{MockServer, TempDir, bin, llm_replay, num, parallel_lock};
use serde_json::{Value, json};

/// Secret values, none a substring of another, each in one credential the old lists missed.
const QUERY_SECRETS: [(&str, &str); 7] = [
    ("subscription-key", "QSECRETsubkey01"),
    ("client_secret", "QSECRETclient02"),
    ("access-token", "QSECRETdash03"),
    ("access_token", "QSECRETunder04"),
    ("private_token", "QSECRETgitlab05"),
    ("jwt", "QSECRETjwt06"),
    ("api%2Dkey", "QSECRETencoded07"),
];
const HEADER_SECRETS: [(&str, &str); 3] = [
    ("x-llm-key", "HSECRETllm08"),
    ("x-access-key", "HSECRETaccess09"),
    ("x-portkey-virtual-key", "HSECRETportkey10"),
];

/// `PATH?` with every query secret and one harmless parameter.
fn path_with_secrets(path: &str) -> String {
    let query: Vec<String> = QUERY_SECRETS
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    format!("{path}?api-version=2024-10-21&{}", query.join("&"))
}

fn assert_no_secret(what: &str, text: &str) {
    for (_, secret) in QUERY_SECRETS.iter().chain(HEADER_SECRETS.iter()) {
        assert!(
            !text.contains(secret),
            "{secret} leaked into {what}:\n{text:.2000}"
        );
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

const CHAT: &str = r#"{"model":"mock-model","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}"#;

/// A `llm-replay record` process in front of `upstream`; SIGKILLed on drop unless stopped.
struct Recorder {
    child: Option<Child>,
    url: String,
}

impl Recorder {
    fn start(upstream: &str, out: &Path) -> Recorder {
        let mut child = Command::new(bin("llm-replay"))
            .args(["record", "--listen", "127.0.0.1:0", "--upstream", upstream])
            .arg("--out")
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("record starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("record prints a readiness line");
        let url = line
            .trim()
            .strip_prefix("llm-replay record listening on ")
            .unwrap_or_else(|| panic!("readiness line {line:?}"))
            .to_owned();
        Recorder {
            child: Some(child),
            url,
        }
    }

    /// SIGTERM and wait: everything queued is written.
    fn stop(mut self) {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        let exit = child.wait().expect("record exits");
        assert!(exit.success(), "record exited with {exit:?}");
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn record_writes_no_credential_query_parameter_or_header() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "2ms", "--itl", "1ms", "--tokens", "3"]);
    let dir = TempDir::new("security-record-credentials");
    let recorded = dir.join("recorded.jsonl");
    let recorder = Recorder::start(&mock.url, &recorded);
    runtime().block_on(async {
        let mut request = reqwest::Client::new()
            .post(format!(
                "{}{}",
                recorder.url,
                path_with_secrets("/v1/chat/completions")
            ))
            .header("content-type", "application/json")
            .header("idempotency-key", "idem-kept-1")
            .header("anthropic-version", "2023-06-01");
        for (name, value) in HEADER_SECRETS {
            request = request.header(name, value);
        }
        let response = request.body(CHAT).send().await.expect("request");
        assert!(response.status().is_success(), "{}", response.status());
        response.bytes().await.expect("body");
    });
    recorder.stop();
    let text = std::fs::read_to_string(&recorded).expect("recording");
    assert_no_secret("the recording", &text);
    let line: Value = serde_json::from_str(text.trim()).expect("one JSON line");
    let request = &line["request"];
    assert_eq!(
        request["path"],
        json!("/v1/chat/completions?api-version=2024-10-21"),
        "harmless parameters are kept: {line:#}"
    );
    // Not secrets, kept for the replay.
    assert_eq!(request["headers"]["idempotency-key"], json!("idem-kept-1"));
    assert_eq!(request["headers"]["anthropic-version"], json!("2023-06-01"));
    assert_eq!(line["response"]["complete"], json!(true), "{line:#}");
}

/// A raw HTTP/1.1 server that keeps every request head it gets and answers each with a
/// short OpenAI chat stream; returns its URL and the heads.
fn start_head_keeper() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let kept = heads.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { break };
            let kept = kept.clone();
            std::thread::spawn(move || {
                let _ = serve_heads(stream, &kept);
            });
        }
    });
    (url, heads)
}

fn serve_heads(stream: TcpStream, heads: &Mutex<Vec<String>>) -> std::io::Result<()> {
    const SSE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\ndata: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut head = String::new();
        let mut content_length = 0usize;
        loop {
            let mut line = String::new();
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
            head.push_str(&line);
        }
        let mut body = vec![0; content_length];
        reader.read_exact(&mut body)?;
        heads.lock().expect("not poisoned").push(head);
        write!(
            writer,
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{SSE}",
            SSE.len()
        )?;
        writer.flush()?;
    }
}

#[test]
fn run_replays_no_credential_found_in_a_recording() {
    let _parallel = parallel_lock();
    let (target, heads) = start_head_keeper();
    let dir = TempDir::new("security-replay-credentials");
    // A recording written by another tool (or an older version) that kept credentials.
    let recording = dir.join("with-credentials.jsonl");
    let mut headers = serde_json::Map::new();
    headers.insert("content-type".into(), json!("application/json"));
    headers.insert("idempotency-key".into(), json!("idem-kept-2"));
    for (name, value) in HEADER_SECRETS {
        headers.insert(name.into(), json!(value));
    }
    let line = json!({"request": {"method": "POST", "path": path_with_secrets("/v1/chat/completions"),
        "headers": headers, "body": CHAT}});
    std::fs::write(&recording, format!("{line}\n")).expect("write recording");
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &target,
            "--schedule",
            "asap",
        ],
        Some(&dir.join("report.json")),
    );
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let report = out.report.expect("report");
    assert_eq!(num(&report, &["requests", "succeeded"]), 1.0, "{report:#}");
    let heads = heads.lock().expect("not poisoned").join("\n");
    assert!(
        heads.contains("/v1/chat/completions?api-version=2024-10-21"),
        "{heads}"
    );
    assert!(
        heads
            .to_ascii_lowercase()
            .contains("idempotency-key: idem-kept-2"),
        "{heads}"
    );
    assert_no_secret("the replayed requests", &heads);
}

#[test]
fn reports_show_a_subscription_key_in_the_target_redacted() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "2ms", "--itl", "1ms", "--tokens", "3"]);
    let dir = TempDir::new("security-report-target");
    let recording = dir.join("rec.jsonl");
    // Paths under the target's `/v1`.
    let line = json!({"request": {"method": "POST", "path": "/chat/completions",
        "headers": {"content-type": "application/json"}, "body": CHAT}});
    std::fs::write(&recording, format!("{line}\n{line}\n")).expect("write recording");
    let secret = "TSECRETsubscription11";
    let encoded = "TSECRETencoded12";
    let target = format!(
        "{}/v1?subscription-key={secret}&api%2Dkey={encoded}",
        mock.url
    );
    let outputs: Vec<PathBuf> = ["report.json", "report.md", "report.html", "junit.xml"]
        .iter()
        .map(|name| dir.join(name))
        .collect();
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &target,
            "--schedule",
            "asap",
            "--report-json",
            path_str(&outputs[0]),
            "--report-md",
            path_str(&outputs[1]),
            "--report-html",
            path_str(&outputs[2]),
            "--junit",
            path_str(&outputs[3]),
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&outputs[0]).expect("json report"))
            .expect("JSON");
    // The mock answered with the query on the request: the target worked as given.
    assert_eq!(num(&report, &["requests", "succeeded"]), 2.0, "{report:#}");
    let mut shown = vec![
        ("stdout", out.stdout.clone()),
        ("stderr", out.stderr.clone()),
    ];
    for path in &outputs {
        shown.push((
            path_str(path),
            std::fs::read_to_string(path).expect("report written"),
        ));
    }
    for (what, text) in &shown {
        assert!(
            !text.contains(secret),
            "{secret} shown in {what}:\n{text:.3000}"
        );
        assert!(
            !text.contains(encoded),
            "{encoded} shown in {what}:\n{text:.3000}"
        );
    }
    let shown_target = report["run"]["target"].as_str().expect("run.target");
    assert!(
        shown_target.contains("subscription-key=REDACTED")
            && shown_target.contains("api%2Dkey=REDACTED"),
        "{shown_target}"
    );
}

#[test]
fn a_12_mib_body_of_control_bytes_through_record_stays_readable() {
    let _parallel = parallel_lock();
    const BODY: usize = 12 << 20;
    let mock = MockServer::start(&["--ttft", "2ms", "--itl", "1ms", "--tokens", "3"]);
    let dir = TempDir::new("security-record-huge-line");
    let recorded = dir.join("recorded.jsonl");
    let recorder = Recorder::start(&mock.url, &recorded);
    runtime().block_on(async {
        let client = reqwest::Client::new();
        let url = format!("{}/v1/chat/completions", recorder.url);
        let normal = client
            .post(&url)
            .header("content-type", "application/json")
            .body(CHAT)
            .send()
            .await
            .expect("request");
        assert!(normal.status().is_success());
        normal.bytes().await.expect("body");
        // 12 MiB of 0x01: valid UTF-8, so stored as text, where each byte is `\u0001`.
        let huge = client
            .post(&url)
            .header("content-type", "application/json")
            .body(vec![1u8; BODY])
            .send()
            .await
            .expect("request");
        // The mock refuses a body that is not JSON; what matters is what is recorded.
        huge.bytes().await.expect("body");
    });
    recorder.stop();

    let text = std::fs::read_to_string(&recorded).expect("recording");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "both exchanges recorded");
    let limit = common::recording::MAX_WRITTEN_LINE_BYTES;
    for line in &lines {
        assert!(line.len() < limit, "a line of {} bytes", line.len());
    }
    let huge: Value = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON line"))
        .find(|l| l["request"]["truncated"] == json!(true))
        .expect("the huge request is marked truncated");
    assert_eq!(huge["request"]["body_bytes"], json!(BODY), "{:.500}", huge);
    let kept = huge["request"]["recorded_bytes"]
        .as_u64()
        .expect("recorded_bytes");
    let body = huge["request"]["body"].as_str().expect("text body");
    assert_eq!(body.len() as u64, kept);
    assert!(body.bytes().all(|b| b == 1), "a prefix of the body");
    assert!(
        kept > (limit / 6 / 2) as u64,
        "kept {kept} bytes: the body gets most of the room"
    );

    let stats = llm_replay(&["recording", "stats", path_str(&recorded), "--json"], None);
    assert_eq!(stats.code, 0, "{}{}", stats.stdout, stats.stderr);
    let stats: Value = serde_json::from_str(&stats.stdout).expect("stats JSON");
    assert_eq!(stats["exchanges"], json!(2), "{stats:#}");
    assert_eq!(stats["truncated_requests"], json!(1), "{stats:#}");

    let run = llm_replay(
        &[
            "run",
            path_str(&recorded),
            "--target",
            &mock.url,
            "--schedule",
            "asap",
        ],
        Some(&dir.join("report.json")),
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = run.report.expect("report");
    assert_eq!(num(&report, &["requests", "total"]), 2.0, "{report:#}");
    assert_eq!(num(&report, &["requests", "succeeded"]), 1.0, "{report:#}");
}

#[test]
fn a_line_over_the_readers_cap_is_skipped_with_a_warning_not_fatal() {
    let _parallel = parallel_lock();
    let mock = MockServer::start(&["--ttft", "2ms", "--itl", "1ms", "--tokens", "3"]);
    let dir = TempDir::new("security-over-long-line");
    let recording = dir.join("rec.jsonl");
    let good = json!({"request": {"method": "POST", "path": "/v1/chat/completions",
        "headers": {"content-type": "application/json"}, "body": CHAT}});
    {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&recording).expect("create"));
        writeln!(out, "{good}").expect("write");
        // Line 2: over the 64 MiB cap (as a writer without a bound could leave it).
        write!(
            out,
            r#"{{"request":{{"path":"/v1/chat/completions","body":""#
        )
        .expect("write");
        let block = vec![b'x'; 1 << 20];
        for _ in 0..=common::recording::MAX_LINE_BYTES >> 20 {
            out.write_all(&block).expect("write");
        }
        writeln!(out, r#""}}}}"#).expect("write");
        writeln!(out, "{good}").expect("write");
        out.flush().expect("flush");
    }
    let name = path_str(&recording);

    let stats = llm_replay(&["recording", "stats", name, "--json"], None);
    assert_eq!(stats.code, 0, "{}{}", stats.stdout, stats.stderr);
    assert!(
        stats.stderr.contains(&format!("{name}:2:")),
        "{}",
        stats.stderr
    );
    let json: Value = serde_json::from_str(&stats.stdout).expect("stats JSON");
    assert_eq!(json["exchanges"], json!(2), "{json:#}");
    assert_eq!(json["skipped_long_lines"], json!(1), "{json:#}");
    assert_eq!(json["skipped_long_line_numbers"], json!([2]), "{json:#}");

    let run = llm_replay(
        &["run", name, "--target", &mock.url, "--schedule", "asap"],
        Some(&dir.join("report.json")),
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains(&format!("{name}:2:")), "{}", run.stderr);
    let report = run.report.expect("report");
    assert_eq!(num(&report, &["requests", "succeeded"]), 2.0, "{report:#}");
}
