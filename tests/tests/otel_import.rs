//! `llm-replay import otel-genai` on the hand-written OTLP JSON fixture
//! (`tests/data/otel/genai_spans.json`): the import's summary, a replay against the embedded
//! mock with whole sessions, and the prompts arriving at a real server through a recorder.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use fixtures::{MockServer, TempDir, bin, llm_replay, num, parallel_lock, test_data};
use serde_json::Value;

/// A value read back from a histogram of 3 significant digits is within 0.1 % (a bucket's
/// width); twice that, for the rounding of the reported value.
const HDR_RELATIVE_ERROR: f64 = 2e-3;

fn path_str(path: &std::path::Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("readable")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

fn messages(exchange: &Value) -> Value {
    let body: Value =
        serde_json::from_str(exchange["request"]["body"].as_str().expect("text body"))
            .expect("JSON body");
    body["messages"].clone()
}

#[test]
fn otel_fixture_imports_and_replays_whole_sessions_with_its_prompts() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("otel-import");
    let recording = dir.join("otel.jsonl");
    let out = llm_replay(
        &[
            "import",
            "otel-genai",
            path_str(&test_data("otel/genai_spans.json")),
            "-o",
            path_str(&recording),
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains(
            "5 spans read, 4 LLM spans imported, 1 non-LLM spans skipped, 0 LLM spans without a prompt skipped"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "0 lack gen_ai.request.model, 0 lack output usage, 2 lack a first-token time"
        ),
        "{}",
        out.stderr
    );
    let imported = lines(&recording);
    assert_eq!(imported.len(), 4);
    let sessions: Vec<&str> = imported
        .iter()
        .map(|ex| ex["session"].as_str().expect("session"))
        .collect();
    assert_eq!(
        sessions,
        [
            "conv-alpha",
            "0af7651916cd43dd8448eb211c80319c",
            "conv-alpha",
            "0af7651916cd43dd8448eb211c80319c"
        ]
    );

    // Against the embedded mock: every LLM span is one succeeded request, sessions whole.
    let report_path = dir.join("report.json");
    let requests_out = dir.join("requests.jsonl");
    let run = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--requests-out",
            path_str(&requests_out),
        ],
        Some(&report_path),
    );
    assert_eq!(
        run.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    let report = run.report.expect("report JSON");
    assert_eq!(num(&report, &["requests", "succeeded"]), 4.0, "{report:#}");
    assert_eq!(num(&report, &["requests", "failed"]), 0.0, "{report:#}");
    // The baseline is what the spans measured: the two with a first-token time (212 ms as an
    // attribute, 240 ms as an event), their durations (850, 900 ms) and output usage (17, 29
    // tokens): ITL (850 − 212) / 16 = 39.875 ms and (900 − 240) / 28 = 23.571 ms.
    let baseline = &report["baseline"];
    assert!(
        baseline["source"]
            .as_str()
            .is_some_and(|s| s.contains("2 of 2 exchanges timed by their source")),
        "{baseline:#}"
    );
    for (key, count, min, max) in [
        ("ttft_ms", 2.0, 212.0, 240.0),
        ("latency_ms", 2.0, 850.0, 900.0),
        ("itl_ms", 2.0, 23.571, 39.875),
    ] {
        let llm = &baseline["llm"];
        assert_eq!(num(llm, &[key, "count"]), count, "{key}: {llm:#}");
        assert!(
            (num(llm, &[key, "min"]) - min).abs() <= min * HDR_RELATIVE_ERROR,
            "{key}: {llm:#}"
        );
        assert!(
            (num(llm, &[key, "max"]) - max).abs() <= max * HDR_RELATIVE_ERROR,
            "{key}: {llm:#}"
        );
    }
    assert!(
        baseline["changes"]["ttft_ms.p50"]["baseline"].is_number(),
        "{baseline:#}"
    );
    let stats = llm_replay(
        &["recording", "stats", path_str(&recording), "--json"],
        None,
    );
    assert_eq!(stats.code, 0, "{}", stats.stderr);
    let stats: Value = serde_json::from_str(&stats.stdout).expect("stats JSON");
    assert_eq!(stats["with_source_timing"], 2, "{stats:#}");
    assert_eq!(stats["ttft_ms"]["count"], 2, "{stats:#}");
    assert_eq!(stats["osl_sources"]["source"], 4, "{stats:#}");
    let requests = lines(&requests_out);
    assert_eq!(requests.len(), 4);
    for session in ["conv-alpha", "0af7651916cd43dd8448eb211c80319c"] {
        let mut turns: Vec<(f64, u64)> = requests
            .iter()
            .filter(|r| r["session"] == session)
            .map(|r| {
                assert_eq!(r["outcome"], "succeeded", "{r}");
                (
                    r["sent_unix_ms"].as_f64().expect("sent"),
                    r["index"].as_u64().expect("index"),
                )
            })
            .collect();
        assert_eq!(turns.len(), 2, "session {session}: {requests:?}");
        turns.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(turns[0].1 < turns[1].1, "session {session} out of order");
    }

    // Through `llm-replay record` in front of a mock process: the server gets the prompts.
    let mock = MockServer::start(&["--ttft", "2ms", "--itl", "1ms", "--tokens", "4"]);
    let captured = dir.join("captured.jsonl");
    let mut recorder = Command::new(bin("llm-replay"))
        .args([
            "record",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &mock.url,
            "--out",
        ])
        .arg(&captured)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("record starts");
    let mut ready = String::new();
    BufReader::new(recorder.stdout.take().expect("piped stdout"))
        .read_line(&mut ready)
        .expect("a readiness line");
    let url = ready.trim().rsplit(' ').next().expect("url").to_owned();
    let run = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &url,
            "--schedule",
            "asap",
        ],
        None,
    );
    // SIGTERM: the recorder writes what it holds and exits.
    let _ = Command::new("kill").arg(recorder.id().to_string()).status();
    let _ = recorder.wait();
    assert_eq!(
        run.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    let mut sent: Vec<Value> = lines(&captured).iter().map(messages).collect();
    let mut want: Vec<Value> = imported.iter().map(messages).collect();
    sent.sort_by_key(|m| m.to_string());
    want.sort_by_key(|m| m.to_string());
    assert_eq!(sent, want);
    assert!(
        want.iter()
            .any(|m| m.to_string().contains("And two thirds minus one sixth?")),
        "{want:?}"
    );
}
