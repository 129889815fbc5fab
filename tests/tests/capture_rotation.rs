//! `llm-replay record` as a sidecar left running (issue 35), real processes on real sockets:
//! a file size limit reached mid-recording (RLIMIT_FSIZE through `prlimit`: EFBIG, the same
//! path as a full disk) never fails a client request, the recording keeps what fit with the
//! gap marked, and `/metrics` and the exit status say how many were not recorded; 1,000
//! streamed exchanges with `--rotate-size`, `--sample 50%` and a session header land in
//! several gzip files, each readable alone, read and replayed as ONE recording of whole
//! sessions.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use common::recording::RecordingReader;
use fixtures::{MockServer, Spawned, TempDir, bin, eventually, num};

/// Start `PREFIX... llm-replay record --listen 127.0.0.1:0 --upstream U --out OUT EXTRA...`.
fn start_recorder(prefix: &[&str], upstream: &str, out: &str, extra: &[&str]) -> (Spawned, String) {
    let binary = bin("llm-replay");
    let binary = binary.to_str().expect("utf-8 path");
    let mut args: Vec<&str> = prefix.to_vec();
    args.push(binary);
    args.extend([
        "record",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--out",
        out,
    ]);
    args.extend_from_slice(extra);
    let (program, rest) = args.split_first().expect("a program");
    let recorder = Spawned::start(Path::new(program), rest, &[]);
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

/// A free loopback port (bound, then let go).
fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").to_string()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn chat(i: usize) -> String {
    serde_json::json!({
        "model": "mock-model",
        "stream": true,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": format!("question {i}: how do tides work?")}],
    })
    .to_string()
}

/// One streamed request through the proxy: its status and whether the stream reached `[DONE]`.
async fn send(
    client: &reqwest::Client,
    url: &str,
    i: usize,
    session: Option<String>,
) -> (u16, bool) {
    let mut request = client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat(i));
    if let Some(session) = session {
        request = request.header("x-session-id", session);
    }
    let response = request.send().await.expect("an answer from the proxy");
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    (status, body.contains("[DONE]"))
}

/// A Prometheus sample's value (`name{labels} value`).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[test]
fn a_full_disk_never_fails_a_request_and_the_gap_is_counted_and_marked() {
    let _parallel = fixtures::parallel_lock();
    assert!(
        Path::new("/usr/bin/prlimit").exists() || Path::new("/bin/prlimit").exists(),
        "this test needs util-linux's prlimit"
    );
    let mock = MockServer::start(&["--ttft", "0ms", "--itl", "0ms", "--tokens", "8"]);
    let dir = TempDir::new("capture-full");
    let out = dir.join("recorded.jsonl");
    let health = free_address();
    // A 40 KB file size limit: a few dozen exchanges fit, then every write fails (EFBIG).
    let (mut recorder, url) = start_recorder(
        &["prlimit", "--fsize=40000", "--"],
        &mock.url,
        out.to_str().expect("utf-8"),
        &["--health-listen", &health],
    );
    const N: usize = 200;
    let rt = runtime();
    let client = reqwest::Client::new();
    let results: Vec<(u16, bool)> = rt.block_on(async { futures_all(&client, &url, N).await });
    let failed: Vec<_> = results
        .iter()
        .filter(|(s, done)| *s != 200 || !done)
        .collect();
    assert!(
        failed.is_empty(),
        "{} requests failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );

    // The metrics say what was dropped (waiting for the writer to have written all).
    let metrics_url = format!("http://{health}/metrics");
    let mut text = String::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            text = rt
                .block_on(async { client.get(&metrics_url).send().await?.text().await })
                .unwrap_or_default();
            text.contains("llm_replay_record_exchanges_recorded_total")
                && metric(&text, "llm_replay_record_exchanges_recorded_total")
                    + metric(
                        &text,
                        "llm_replay_record_exchanges_dropped_total{reason=\"disk_full\"}",
                    )
                    == N as f64
        }),
        "recorded + dropped != {N}:\n{text}\n{}",
        recorder.stderr()
    );
    let dropped = metric(
        &text,
        "llm_replay_record_exchanges_dropped_total{reason=\"disk_full\"}",
    );
    let recorded = metric(&text, "llm_replay_record_exchanges_recorded_total");
    assert_eq!(
        metric(&text, "llm_replay_record_exchanges_seen_total"),
        N as f64
    );
    assert!(
        dropped > 0.0 && recorded > 0.0,
        "dropped {dropped}, recorded {recorded}"
    );
    let ready = rt
        .block_on(async { client.get(format!("http://{health}/readyz")).send().await })
        .expect("readyz answers");
    assert_eq!(ready.status(), 200);

    let code = terminate(&mut recorder);
    let stderr = recorder.stderr();
    assert_eq!(code, 3, "exit 3 when exchanges were not recorded: {stderr}");
    assert!(
        stderr.contains(&format!(
            "{} exchanges were proxied but not recorded",
            dropped as u64
        )),
        "{stderr}"
    );
    assert!(std::fs::metadata(&out).expect("recording").len() <= 40_000);

    // The recording: what fit, then the gap, marked with its count.
    let mut reader = RecordingReader::open(&out).expect("readable");
    let mut exchanges = 0u64;
    for item in reader.by_ref() {
        item.expect("every exchange line reads");
        exchanges += 1;
    }
    let gaps = reader.gaps();
    assert_eq!(exchanges, recorded as u64);
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert_eq!(gaps[0].reason, "disk_full");
    assert_eq!(gaps[0].exchanges, dropped as u64, "{gaps:?}");
    assert!(gaps[0].from.is_some() && gaps[0].to.is_some());
    eprintln!(
        "disk full: {N} requests all answered; {exchanges} recorded, {dropped} dropped and marked"
    );
}

/// `n` requests, 4 at a time.
async fn futures_all(client: &reqwest::Client, url: &str, n: usize) -> Vec<(u16, bool)> {
    let mut out = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(4) {
        let mut tasks = Vec::new();
        for &i in chunk {
            let client = client.clone();
            let url = url.to_owned();
            tasks.push(tokio::spawn(
                async move { send(&client, &url, i, None).await },
            ));
        }
        for task in tasks {
            out.push(task.await.expect("task"));
        }
    }
    out
}

#[test]
fn a_thousand_exchanges_rotate_into_gzip_files_read_as_one_sampled_recording_of_whole_sessions() {
    let _parallel = fixtures::parallel_lock();
    let mock = MockServer::start(&["--ttft", "0ms", "--itl", "0ms", "--tokens", "8"]);
    let dir = TempDir::new("capture-rotation");
    let out = format!("{}/", dir.join("recordings").display());
    let (mut recorder, url) = start_recorder(
        &[],
        &mock.url,
        &out,
        &[
            "--rotate-size",
            "12KiB",
            "--sample",
            "50%",
            "--session-header",
            "x-session-id",
        ],
    );
    const SESSIONS: usize = 100;
    const PER_SESSION: usize = 10;
    let rt = runtime();
    let client = reqwest::Client::new();
    let results: Vec<(u16, bool)> = rt.block_on(async {
        let mut out = Vec::new();
        // 8 sessions at a time, each session's turns in order.
        for group in (0..SESSIONS).collect::<Vec<_>>().chunks(8) {
            let mut tasks = Vec::new();
            for &s in group {
                let client = client.clone();
                let url = url.clone();
                tasks.push(tokio::spawn(async move {
                    let mut results = Vec::new();
                    for turn in 0..PER_SESSION {
                        let i = s * PER_SESSION + turn;
                        results.push(send(&client, &url, i, Some(format!("session-{s}"))).await);
                    }
                    results
                }));
            }
            for task in tasks {
                out.extend(task.await.expect("task"));
            }
        }
        out
    });
    assert_eq!(results.len(), SESSIONS * PER_SESSION);
    assert!(results.iter().all(|(s, done)| *s == 200 && *done));
    assert_eq!(terminate(&mut recorder), 0, "{}", recorder.stderr());

    let recordings = dir.join("recordings");
    let mut files: Vec<_> = std::fs::read_dir(&recordings)
        .expect("the directory")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{} files: {files:?}", files.len());
    // Each file is gzip, complete, and readable alone.
    let mut per_file = 0u64;
    for file in &files {
        let name = file.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(
            name.starts_with("recording-") && name.ends_with(".jsonl.gz"),
            "{name}"
        );
        let mut raw = Vec::new();
        std::fs::File::open(file)
            .expect("open")
            .read_to_end(&mut raw)
            .expect("read");
        assert_eq!(&raw[..2], &[0x1f, 0x8b], "{name} is gzip");
        let mut text = String::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_string(&mut text)
            .expect("a complete gzip stream");
        assert!(
            text.starts_with("{\"recording\":"),
            "{name} starts with its header"
        );
        let mut reader = RecordingReader::open(file).expect("readable alone");
        for item in reader.by_ref() {
            item.expect("every line reads");
            per_file += 1;
        }
        assert_eq!(
            reader.sample_share(),
            Some(0.5),
            "{name} says what share it holds"
        );
        assert_eq!(reader.torn_last_line(), None);
    }

    // The directory reads as one recording: ~50 % of the sessions, each whole.
    let mut reader = RecordingReader::open(&recordings).expect("the directory reads");
    let mut sessions: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut total = 0u64;
    for item in reader.by_ref() {
        let (_, exchange) = item.expect("every line reads");
        total += 1;
        let session = exchange.session.clone().expect("a session");
        let body = exchange.request.body.clone().expect("a body");
        sessions.entry(session).or_default().insert(body);
    }
    assert_eq!(total, per_file);
    assert!(reader.gaps().is_empty());
    let kept = sessions.len();
    assert!(
        (35..=65).contains(&kept),
        "{kept} sessions of {SESSIONS} kept at 50 %"
    );
    for (session, turns) in &sessions {
        assert_eq!(turns.len(), PER_SESSION, "{session} is whole");
    }
    assert_eq!(total as usize, kept * PER_SESSION);

    // `recording stats DIR` and `run DIR` read it as one recording.
    let stats = fixtures::llm_replay(
        &[
            "recording",
            "stats",
            recordings.to_str().expect("utf-8"),
            "--json",
        ],
        None,
    );
    assert_eq!(stats.code, 0, "{}", stats.stderr);
    let stats: serde_json::Value = serde_json::from_str(&stats.stdout).expect("JSON");
    assert_eq!(stats["exchanges"].as_u64(), Some(total));
    let report_path = dir.join("report.json");
    let replay = fixtures::llm_replay(
        &[
            "run",
            recordings.to_str().expect("utf-8"),
            "--target",
            &mock.url,
            "--schedule",
            "asap",
            "--concurrency",
            "8",
        ],
        Some(&report_path),
    );
    assert_eq!(replay.code, 0, "{}{}", replay.stdout, replay.stderr);
    let report = replay.report.expect("report");
    assert_eq!(num(&report, &["requests", "succeeded"]) as u64, total);
    let warnings = report["warnings"].to_string();
    assert!(
        warnings.contains("50 %") && warnings.contains("--speed 2"),
        "run says the recording holds half the traffic: {warnings}"
    );
    assert!(replay.stdout.contains("--speed 2"), "{}", replay.stdout);
    eprintln!(
        "rotation: {} files, {total} exchanges in {kept} whole sessions of {SESSIONS}",
        files.len()
    );
}
