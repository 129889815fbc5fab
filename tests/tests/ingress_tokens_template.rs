//! Issue 33 item 10: a tokenizer folder as models ship it today, its chat template in
//! `chat_template.jinja` beside `tokenizer.json` (no `tokenizer_config.json`), is read with
//! that template: chat prompts are counted rendered (role markers included), more than
//! their bare texts; the same folder without the template warns in `run` that chat requests
//! are counted without one. Counts only, no timing.

use std::path::Path;

use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, test_data};
use serde_json::json;

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Run the chat `recording` against `mock` with `--tokenizer DIR/tokenizer.json`.
fn run_with_tokenizer(
    recording: &Path,
    mock: &MockServer,
    dir: &Path,
) -> (serde_json::Value, String) {
    let tokenizer = dir.join("tokenizer.json");
    let report = dir.join("report.json");
    let out = llm_replay(
        &[
            "run",
            recording.to_str().expect("utf-8 path"),
            "--target",
            &mock.url,
            "--no-server-metrics",
            "--tokenizer",
            tokenizer.to_str().expect("utf-8 path"),
        ],
        Some(&report),
    );
    assert_eq!(
        out.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    (out.report.expect("report JSON"), out.stdout)
}

#[test]
fn a_chat_template_in_chat_template_jinja_is_read_and_its_absence_warned() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("tokens-template");
    let recording = dir.join("rec.jsonl");
    let mut text = String::new();
    for i in 0..4 {
        let body = json!({"model": "m", "stream": true, "max_tokens": 4, "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": format!("Question {i}: what is a tide?")}]});
        let line = json!({"id": format!("ex-{i}"), "request": {"method": "POST",
            "path": "/v1/chat/completions", "headers": {"content-type": "application/json"},
            "body": body.to_string()}});
        text.push_str(&format!("{line}\n"));
    }
    std::fs::write(&recording, text).expect("write the recording");
    let mock = MockServer::start(&[
        "--ttft", "2ms", "--itl", "1ms", "--tokens", "4", "--usage", "off",
    ]);

    let bare = dir.join("bare");
    let templated = dir.join("templated");
    for folder in [&bare, &templated] {
        std::fs::create_dir_all(folder).expect("mkdir");
        std::fs::copy(test_data("tokenizer.json"), folder.join("tokenizer.json")).expect("copy");
    }
    std::fs::write(templated.join("chat_template.jinja"), CHATML).expect("write the template");

    let (bare_report, bare_stdout) = run_with_tokenizer(&recording, &mock, &bare);
    let (templated_report, templated_stdout) = run_with_tokenizer(&recording, &mock, &templated);
    for report in [&bare_report, &templated_report] {
        assert_eq!(
            report["requests"]["token_source"]["input"]["tokenizer"], 4,
            "{report}"
        );
    }
    let bare_isl = num(&bare_report, &["llm", "isl_tokens", "avg"]);
    let templated_isl = num(&templated_report, &["llm", "isl_tokens", "avg"]);
    // Two messages' markers and the generation prompt: several tokens more per request.
    assert!(
        templated_isl >= bare_isl + 6.0,
        "with the template {templated_isl} tokens, without {bare_isl}"
    );
    let warning = "no chat template";
    assert!(
        bare_report["warnings"].to_string().contains(warning),
        "{}",
        bare_report["warnings"]
    );
    assert!(bare_stdout.contains(warning), "{bare_stdout}");
    assert!(!templated_report["warnings"].to_string().contains(warning));
    assert!(!templated_stdout.contains(warning), "{templated_stdout}");
}
