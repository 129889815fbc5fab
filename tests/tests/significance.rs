//! Significance of baseline changes (issue 12): every `baseline.changes[...]` carries a
//! bootstrap interval of its percent change, and only significant changes are highlighted.
//!
//! Real processes: `llm-replay run` against its embedded mock (which serves the recording's
//! own frames at their recorded offsets) and against `llm-replay mock --ttft 100ms`. Both
//! replay the recording's schedule (40 exchanges 60 ms apart) at `--speed 2`: speed scales
//! the arrivals, not the frames, so every compared distribution is the same, in half the
//! time (1.2 s).

use std::path::Path;

use fixtures::{MockServer, TempDir, llm_replay, num};
use serde_json::{Value, json};

const EXCHANGES: u32 = 40;

/// A recording of [`EXCHANGES`] streamed OpenAI chat exchanges whose TTFTs are
/// `ttft_ms(k)` and ITLs `itl_ms(k)` for a shuffled `k` in `0..EXCHANGES`, 8 tokens each.
fn write_recording(path: &Path, ttft_ms: impl Fn(f64) -> f64, itl_ms: impl Fn(f64) -> f64) {
    let mut text = String::new();
    for i in 0..EXCHANGES {
        // 37 is prime to 40: every k once, in a scrambled order.
        let k = f64::from(i * 37 % EXCHANGES);
        let (ttft, itl) = (ttft_ms(k), itl_ms(k));
        let tokens = 8;
        let mut frames: Vec<Value> = (0..tokens)
            .map(|n| {
                json!({"t_ms": ttft + f64::from(n) * itl,
                       "data": "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word \"}}]}\n\n"})
            })
            .collect();
        let usage =
            json!({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": tokens}});
        frames.push(json!({"t_ms": ttft + f64::from(tokens - 1) * itl + 0.2,
                           "data": format!("data: {usage}\n\ndata: [DONE]\n\n")}));
        let body = json!({
            "model": "m", "stream": true, "max_tokens": tokens,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": format!("Question {i}: how do tides work?")}],
        });
        let line = json!({
            "id": format!("x{i}"),
            "at_ms": f64::from(i) * 60.0,
            "request": {"method": "POST", "path": "/v1/chat/completions",
                        "headers": {"content-type": "application/json"},
                        "body": body.to_string()},
            "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
                         "frames": frames, "complete": true},
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).expect("write recording");
}

fn change<'a>(report: &'a Value, key: &str) -> &'a Value {
    &report["baseline"]["changes"][key]
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Acceptance (issue 12): the recording replayed against the embedded mock, which serves its
/// own frames at their recorded offsets, is the same distribution: no change is significant,
/// every interval that is known contains 0, and nothing is highlighted.
#[test]
fn replay_of_the_same_distribution_marks_no_change_significant() {
    let _timing = fixtures::timing_lock();
    let dir = TempDir::new("significance-same");
    let recording = dir.join("rec.jsonl");
    // TTFT 30–147 ms in 3 ms steps, ITL 4–23.5 ms in 0.5 ms steps.
    write_recording(&recording, |k| 30.0 + 3.0 * k, |k| 4.0 + 0.5 * k);
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &["run", path_str(&recording), "--speed", "2"],
        Some(&report_path),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report = out.report.expect("report");
    assert_eq!(
        num(&report, &["requests", "succeeded"]),
        f64::from(EXCHANGES)
    );
    let changes = report["baseline"]["changes"]
        .as_object()
        .expect("baseline.changes");
    let mut with_interval = 0;
    for (key, change) in changes {
        println!(
            "{key}: {} [{}, {}] significant {}",
            change["change_pct"],
            change["ci_low_pct"],
            change["ci_high_pct"],
            change["significant"]
        );
        assert_ne!(change["significant"], json!(true), "{key}: {change}");
        if let (Some(low), Some(high)) = (
            change["ci_low_pct"].as_f64(),
            change["ci_high_pct"].as_f64(),
        ) {
            with_interval += 1;
            assert!(low <= 0.0 && 0.0 <= high, "{key}: {change}");
        }
    }
    // Every statistic of the five distributions with samples on both sides has an interval.
    assert!(with_interval >= 5 * 7, "only {with_interval} intervals");
    assert_eq!(change(&report, "ttft_ms.p95")["significant"], json!(false));
}

/// Acceptance (issue 12): a recording with a 50 ms TTFT replayed against a server with a
/// 100 ms TTFT: the TTFT change is significant and its interval contains +100 %.
#[test]
fn doubled_ttft_is_significant_and_its_interval_contains_plus_100_percent() {
    let _timing = fixtures::timing_lock();
    let dir = TempDir::new("significance-doubled");
    let recording = dir.join("rec.jsonl");
    // TTFT 30–69 ms (mean and median about 50 ms), ITL 5 ms.
    write_recording(&recording, |k| 30.0 + k, |_| 5.0);
    let mock = MockServer::start(&["--ttft", "100ms", "--itl", "5ms", "--tokens", "8"]);
    let report_path = dir.join("report.json");
    let out = llm_replay(
        &[
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            "--speed",
            "2",
        ],
        Some(&report_path),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report = out.report.expect("report");
    assert_eq!(
        num(&report, &["requests", "succeeded"]),
        f64::from(EXCHANGES)
    );
    for stat in ["avg", "min", "max", "p50", "p90", "p95", "p99"] {
        let key = format!("ttft_ms.{stat}");
        let c = change(&report, &key);
        println!(
            "{key}: {} [{}, {}] significant {}",
            c["change_pct"], c["ci_low_pct"], c["ci_high_pct"], c["significant"]
        );
        assert_eq!(c["significant"], json!(true), "{key}: {c}");
        assert_eq!(c["highlight"], json!(true), "{key}: {c}");
    }
    for stat in ["avg", "p50"] {
        let key = format!("ttft_ms.{stat}");
        let c = change(&report, &key);
        let low = c["ci_low_pct"].as_f64().expect("ci_low_pct");
        let high = c["ci_high_pct"].as_f64().expect("ci_high_pct");
        assert!(low < 100.0 && 100.0 < high, "{key}: {c}");
    }
}
