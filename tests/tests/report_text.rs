//! Issue 33 items 16, 18, 19, 20: the report's words, from real runs against the mock.
//!
//! - The load line is words, on the terminal, in Markdown and HTML, never raw JSON.
//! - Input tokens estimated from characters are named beside the output estimate.
//! - Streams cut mid-body keep their TTFT: no "every distribution is empty".
//! - After head-only cuts the verdict says a response head came, and the Markdown report has
//!   no literal `&#39;` and no hidden zero-width space in a URL.
//!
//! Text only, no timing tolerance.

use std::path::Path;

use fixtures::{MockServer, TempDir, llm_replay, parallel_lock, write_chat_recording};

struct Rendered {
    code: i32,
    terminal: String,
    markdown: String,
    html: String,
    json: serde_json::Value,
}

fn run(dir: &Path, tag: &str, mock_args: &[&str]) -> Rendered {
    let mock = MockServer::start(mock_args);
    let recording = dir.join(format!("{tag}.jsonl"));
    write_chat_recording(&recording, 6, 10, None);
    let md = dir.join(format!("{tag}.md"));
    let html = dir.join(format!("{tag}.html"));
    let json = dir.join(format!("{tag}.json"));
    let out = llm_replay(
        &[
            "run",
            recording.to_str().expect("utf-8 path"),
            "--target",
            &mock.url,
            "--concurrency",
            "2",
            "--no-server-metrics",
            "--report-md",
            md.to_str().expect("utf-8 path"),
            "--report-html",
            html.to_str().expect("utf-8 path"),
        ],
        Some(&json),
    );
    Rendered {
        code: out.code,
        terminal: format!("{}{}", out.stdout, out.stderr),
        markdown: std::fs::read_to_string(&md).expect("markdown written"),
        html: std::fs::read_to_string(&html).expect("html written"),
        json: out.report.expect("report JSON"),
    }
}

#[test]
fn load_in_words_input_estimate_named_and_cut_streams_worded_right() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("report-text");
    let fast = ["--ttft", "2ms", "--itl", "1ms", "--tokens", "10"];

    let plain = run(
        dir.path(),
        "plain",
        &[&fast[..], &["--usage", "off"]].concat(),
    );
    assert_eq!(plain.code, 0, "{}", plain.terminal);
    let words = "closed loop, concurrency 2, as fast as possible, 1 worker";
    let words_html = words;
    assert!(
        plain.terminal.contains(&format!("load      {words}")),
        "{}",
        plain.terminal
    );
    assert!(
        plain.markdown.contains(&format!("load: {words}")),
        "{}",
        plain.markdown
    );
    assert!(plain.html.contains(words_html), "HTML load line");
    for text in [&plain.terminal, &plain.markdown, &plain.html] {
        assert!(!text.contains("\"schedule\""), "raw JSON load:\n{text}");
    }
    assert!(
        plain
            .terminal
            .contains("· input estimated 6 (characters / 4)"),
        "{}",
        plain.terminal
    );

    // Every stream cut after half its tokens: ended early, TTFT measured.
    let dropped = run(
        dir.path(),
        "dropped",
        &[&fast[..], &["--drop-rate", "1"]].concat(),
    );
    let warnings = dropped.json["warnings"].to_string();
    assert!(
        !warnings.contains("every distribution is empty"),
        "{warnings}"
    );
    assert!(
        warnings.contains("only the time to first token of the 6 streams"),
        "{warnings}"
    );

    // Every stream cut right after its 200 head.
    let cut = run(
        dir.path(),
        "cut",
        &[&fast[..], &["--cut-after-head-rate", "1"]].concat(),
    );
    assert_eq!(cut.code, 3, "{}", cut.terminal);
    assert!(
        !cut.terminal.contains("got a response: every one"),
        "{}",
        cut.terminal
    );
    assert!(
        cut.terminal.contains("got a response head"),
        "{}",
        cut.terminal
    );
    assert!(
        cut.markdown.contains("gateway's read timeout"),
        "{}",
        cut.markdown
    );
    for text in [&plain.markdown, &dropped.markdown, &cut.markdown] {
        assert!(!text.contains("&#39;"), "a literal entity:\n{text}");
        assert!(!text.contains('\u{200b}'), "a zero-width space:\n{text}");
    }
}
