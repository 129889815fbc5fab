//! Issue 18 (security, second review), the outputs: a file a command writes never destroys an
//! input or another output and the check never removes what was there (items 7 and 10), a
//! failure writing any output fails the run (item 9), a closed stdout never panics (item 11),
//! text from recordings and peers never drives the terminal (item 14) nor becomes HTML in the
//! Markdown report (item 15), and `llm-replay token` (item 2). Each test reproduces the
//! failure of the earlier code with the release binaries and real processes.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use fixtures::{MockServer, TempDir, bin, write_chat_recording};
use serde_json::json;

const ESC: u8 = 0x1b;
const HOSTILE_MODEL: &str = "\u{1b}]0;pwned\u{7}\u{1b}[2J";

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn llm_replay(args: &[&str]) -> Output {
    Command::new(bin("llm-replay"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("llm-replay runs")
}

fn all_output(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `n` streamed chat exchanges asking for `model`, 5 ms apart.
fn write_model_recording(path: &Path, n: usize, model: &str) {
    let mut out = std::fs::File::create(path).expect("create recording");
    for i in 0..n {
        let body = json!({
            "model": model,
            "stream": true,
            "max_tokens": 5,
            "messages": [{"role": "user", "content": format!("question {i}")}],
        });
        let line = json!({
            "id": format!("ex-{i}"),
            "at_ms": i as f64 * 5.0,
            "request": {
                "method": "POST",
                "path": "/v1/chat/completions",
                "headers": {"content-type": "application/json"},
                "body": body.to_string(),
            },
        });
        writeln!(out, "{line}").expect("write recording");
    }
}

/// A recorder stopped mid-line: the run warns about the file by name.
fn tear_last_line(path: &Path) {
    let mut out = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open recording");
    write!(out, "{{\"id\":\"torn").expect("append torn line");
}

/// Item 7: an output that names the recording (by any spelling, link or hard link) or another
/// output is a usage error before any load is sent, and nothing is overwritten.
#[test]
fn outputs_naming_the_recording_or_each_other_are_refused_before_any_load() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("same-outputs");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 40, 5, Some(5.0));
    let original = std::fs::read(&recording).expect("read recording");
    std::fs::hard_link(&recording, dir.join("hard.jsonl")).expect("hard link");
    std::os::unix::fs::symlink(&recording, dir.join("soft.jsonl")).expect("symlink");
    std::fs::create_dir(dir.join("sub")).expect("sub dir");
    let log = dir.join("requests.log");
    let mock = MockServer::start(&[
        "--ttft",
        "1ms",
        "--itl",
        "1ms",
        "--tokens",
        "3",
        "--request-log",
        path_str(&log),
    ]);
    let at = |name: &str| path_str(&dir.join(name)).to_owned();
    let cases: Vec<Vec<String>> = vec![
        vec!["--requests-out".into(), at("rec.jsonl")],
        vec!["--report-json".into(), at("rec.jsonl")],
        vec!["--report-md".into(), at("hard.jsonl")],
        vec!["--requests-out".into(), at("soft.jsonl")],
        vec!["--junit".into(), at("sub/../rec.jsonl")],
        vec![
            "--report-json".into(),
            at("a.out"),
            "--report-html".into(),
            at("a.out"),
        ],
        vec![
            "--report-json".into(),
            at("b.out"),
            "--requests-out".into(),
            at("sub/../b.out"),
        ],
    ];
    for case in &cases {
        let mut args = vec!["run", path_str(&recording), "--target", &mock.url];
        args.extend(case.iter().map(String::as_str));
        let out = llm_replay(&args);
        let text = all_output(&out);
        assert_eq!(out.status.code(), Some(2), "{case:?}: {text}");
        assert!(
            text.contains("same file") || text.contains("the recording"),
            "{case:?}: {text}"
        );
        assert_eq!(
            std::fs::read(&recording).expect("read recording"),
            original,
            "{case:?}: the recording was changed"
        );
        assert!(
            !dir.join("a.out").exists() && !dir.join("b.out").exists(),
            "{case:?}: an output was written"
        );
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            logged.trim().is_empty(),
            "{case:?}: load was sent: {logged}"
        );
    }

    // `export`: its output is never its input, through a hard link either.
    for output in ["rec.jsonl", "hard.jsonl", "soft.jsonl"] {
        let out = llm_replay(&[
            "export",
            "aiperf",
            path_str(&recording),
            "--output",
            &at(output),
        ]);
        assert_eq!(out.status.code(), Some(2), "{output}: {}", all_output(&out));
        assert_eq!(
            std::fs::read(&recording).expect("read recording"),
            original,
            "export to {output} changed the recording"
        );
    }
}

/// Item 9: `--requests-out` that cannot be written fails the run (exit 3) naming the path, like
/// a report file does, and the reports are written all the same. A device that takes the
/// lines (`/dev/null`) is not a failure.
#[test]
fn a_requests_out_that_cannot_be_written_fails_the_run_and_the_reports_are_written() {
    let _parallel = fixtures::parallel_lock();
    let full = Path::new("/dev/full");
    assert!(full.exists(), "this test needs Linux's /dev/full");
    let dir = TempDir::new("requests-out-full");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 10, 5, Some(5.0));
    let mock = MockServer::start(&["--ttft", "1ms", "--itl", "1ms", "--tokens", "3"]);
    let json_report = dir.join("report.json");
    let md_report = dir.join("report.md");
    let out = llm_replay(&[
        "run",
        path_str(&recording),
        "--target",
        &mock.url,
        "--requests-out",
        "/dev/full",
        "--report-json",
        path_str(&json_report),
        "--report-md",
        path_str(&md_report),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{}", all_output(&out));
    assert!(
        stderr.contains("--requests-out /dev/full"),
        "the message does not name the path: {stderr}"
    );
    assert!(
        json_report.exists() && md_report.exists(),
        "the other outputs were not written"
    );

    let out = llm_replay(&[
        "run",
        path_str(&recording),
        "--target",
        &mock.url,
        "--requests-out",
        "/dev/null",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
}

/// Item 10: an output that is a symbolic link to nothing is refused (exit 2, named) and left
/// as it was; the check creates nothing at its target. A link to an existing file is followed.
#[test]
fn a_dangling_symlink_output_is_refused_and_left_in_place() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("dangling-output");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 4, 5, Some(5.0));
    let log = dir.join("requests.log");
    let mock = MockServer::start(&[
        "--ttft",
        "1ms",
        "--itl",
        "1ms",
        "--tokens",
        "3",
        "--request-log",
        path_str(&log),
    ]);
    let link = dir.join("link.out");
    let target = dir.join("missing.out");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    for flag in ["--report-json", "--report-md", "--requests-out"] {
        let out = llm_replay(&[
            "run",
            path_str(&recording),
            "--target",
            &mock.url,
            flag,
            path_str(&link),
        ]);
        let text = all_output(&out);
        assert_eq!(out.status.code(), Some(2), "{flag}: {text}");
        assert!(text.contains(path_str(&link)), "{flag}: {text}");
        let kept = std::fs::symlink_metadata(&link).expect("the link is still there");
        assert!(
            kept.file_type().is_symlink(),
            "{flag}: the link was replaced"
        );
        assert!(
            !target.exists(),
            "{flag}: the check created the link's target"
        );
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(logged.trim().is_empty(), "{flag}: load was sent: {logged}");
    }

    let existing = dir.join("existing.json");
    std::fs::write(&existing, "").expect("write");
    let followed = dir.join("followed.json");
    std::os::unix::fs::symlink(&existing, &followed).expect("symlink");
    let out = llm_replay(&[
        "run",
        path_str(&recording),
        "--target",
        &mock.url,
        "--report-json",
        path_str(&followed),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let written = std::fs::read_to_string(&existing).expect("read");
    assert!(
        written.contains("\"schema\""),
        "not written through the link: {written}"
    );
}

/// Spawn `llm-replay ARGS` with its stdout a pipe whose reader is already gone, and wait.
fn with_closed_stdout(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(bin("llm-replay"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("llm-replay starts");
    // The only reader: every write to stdout from now on fails with EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("llm-replay ends");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Item 11: `recording stats ... | head -c 10` and the like: a closed stdout ends the printing
/// quietly, the command exits with its own code, and `run` still writes its files.
#[test]
fn a_closed_stdout_never_panics() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("closed-stdout");
    let recording = dir.join("rec.jsonl");
    write_chat_recording(&recording, 6, 5, Some(5.0));
    let report = dir.join("report.json");
    let rec = path_str(&recording);
    let runs: [Vec<&str>; 4] = [
        vec!["recording", "stats", "--json", rec],
        vec!["recording", "stats", rec],
        vec!["token"],
        vec!["run", rec, "--report-json", path_str(&report)],
    ];
    for args in runs {
        let (code, stderr) = with_closed_stdout(&args);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
    }
    assert!(report.exists(), "run did not write its report");
}

/// Item 14: escape sequences in a recording (its model names, its file name) or from a peer
/// (a worker's id) reach the terminal as visible text, never as escapes.
#[test]
fn control_characters_from_recordings_and_peers_never_reach_the_terminal() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("terminal-escapes");
    let recording = dir.join("rec\u{1b}]0;title\u{7}.jsonl");
    write_model_recording(&recording, 6, HOSTILE_MODEL);

    for json in [false, true] {
        let mut args = vec!["recording", "stats"];
        if json {
            args.push("--json");
        }
        args.push(path_str(&recording));
        let out = llm_replay(&args);
        assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
        assert!(
            !out.stdout.contains(&ESC) && !out.stderr.contains(&ESC),
            "json {json}: an escape reached the terminal: {:?}",
            all_output(&out)
        );
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains("pwned"),
            "json {json}: the model is not shown: {shown}"
        );
    }

    // `run` names the recording in its warnings (a torn last line) and in the report.
    tear_last_line(&recording);
    let out = llm_replay(&["run", path_str(&recording)]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(
        !out.stdout.contains(&ESC) && !out.stderr.contains(&ESC),
        "an escape reached the terminal: {:?}",
        all_output(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\\x1b]0;title\\x07"),
        "the file name is not shown escaped: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // A remote worker chooses its own id: it is shown in the workers table.
    let plain = dir.join("plain.jsonl");
    write_chat_recording(&plain, 4, 5, Some(5.0));
    let token = "0123456789abcdef0123456789abcdef";
    let (mut coordinator, addr) = fixtures::coordinator(
        &[path_str(&plain), "--token", token, "--join-timeout", "30s"],
        1,
        &[],
    );
    let _worker = fixtures::worker(
        &addr,
        "w\u{1b}]0;pwned\u{7}\u{1b}[2J",
        &["--token", token],
        &[],
    );
    let code = coordinator.wait_timeout(Duration::from_secs(60));
    let stdout = coordinator.stdout();
    let stderr = coordinator.stderr();
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        !stdout.contains('\u{1b}') && !stderr.contains('\u{1b}'),
        "an escape reached the terminal: {stdout:?} {stderr:?}"
    );
    assert!(stdout.contains("w\\x1b]0;pwned"), "{stdout}");
}

/// Item 15: a recording named like an HTML tag is text in the Markdown report (it goes into
/// pull-request comments) and in the HTML report, never markup.
#[test]
fn recording_names_are_escaped_in_the_markdown_and_html_reports() {
    let _parallel = fixtures::parallel_lock();
    let dir = TempDir::new("markdown-html");
    let recording = dir.join("<img src=x onerror=alert(9)>.jsonl");
    write_chat_recording(&recording, 4, 5, Some(5.0));
    tear_last_line(&recording);
    let md = dir.join("report.md");
    let html = dir.join("report.html");
    let out = llm_replay(&[
        "run",
        path_str(&recording),
        "--report-md",
        path_str(&md),
        "--report-html",
        path_str(&html),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    let md = std::fs::read_to_string(&md).expect("markdown written");
    assert!(
        !md.contains("<img"),
        "raw HTML in the Markdown report:\n{md}"
    );
    assert!(
        md.contains("&lt;img src=x onerror=alert(9)&gt;.jsonl"),
        "the recording is not named:\n{md}"
    );
    let html = std::fs::read_to_string(&html).expect("html written");
    assert!(!html.contains("<img"), "raw HTML in the HTML report");
    assert!(html.contains("&lt;img src=x onerror=alert(9)&gt;.jsonl"));
}

/// Item 2: `llm-replay token` prints a fresh 128-bit token, 32 lowercase hex digits.
#[test]
fn token_prints_a_fresh_128_bit_token() {
    let _parallel = fixtures::parallel_lock();
    let tokens: Vec<String> = (0..2)
        .map(|_| {
            let out = llm_replay(&["token"]);
            assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert_eq!(text.lines().count(), 1, "{text:?}");
            let token = text.trim().to_owned();
            assert!(
                token.len() == 32
                    && token
                        .chars()
                        .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
                "not 32 lowercase hex digits: {token:?}"
            );
            token
        })
        .collect();
    assert_ne!(tokens[0], tokens[1], "the same token twice");
    let help = llm_replay(&["--help"]);
    assert!(
        String::from_utf8_lossy(&help.stdout)
            .contains("print a fresh random token for --token / LLM_REPLAY_TOKEN (128 bits)"),
        "{}",
        all_output(&help)
    );
}
