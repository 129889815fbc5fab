//! `--tokenizer FILE`: output of a known token count under a real tokenizer
//! (tests/data/tokenizer.json: byte-level BPE, NFKC), exact usage, two-token frames.

use super::*;

fn tokenizer_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer.json")
}

fn load() -> Arc<MockTokenizer> {
    Arc::new(MockTokenizer::load(&tokenizer_path()).expect("tests/data/tokenizer.json loads"))
}

/// The content deltas and the usage chunk of an OpenAI chat stream.
fn chat_stream(text: &str) -> (Vec<String>, Option<serde_json::Value>) {
    let mut deltas = Vec::new();
    let mut usage = None;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            continue;
        }
        let chunk: serde_json::Value = serde_json::from_str(data).expect("chunk json");
        // The role chunk's empty content is no token.
        if let Some(content) = chunk["choices"][0]["delta"]["content"]
            .as_str()
            .filter(|c| !c.is_empty())
        {
            deltas.push(content.to_owned());
        }
        if !chunk["usage"].is_null() {
            usage = Some(chunk["usage"].clone());
        }
    }
    (deltas, usage)
}

#[test]
fn n_output_words_are_exactly_n_tokens() {
    let _timing = common::test_timing::timing_lock_blocking();
    let mock = load();
    let words = mock.words().len();
    assert!(words >= 200, "{words} words");
    assert!(
        mock.words()
            .iter()
            .all(|w| w.bytes().all(|b| b.is_ascii_alphabetic()))
    );
    // Counted by the tokenizer the replay counts with, loaded on its own.
    let counter = common::tokenizer::Tokenizer::from_file(&tokenizer_path()).expect("loads");
    for n in (0..=3 * words as u64 + 7).chain([4096, 10_000]) {
        let text = mock.text(n);
        assert_eq!(counter.count_text(&text), n, "{n} words: {text:?}");
    }
    // Frame by frame too (a client that counts each delta and adds them up).
    let mut total = 0;
    for i in 0..500 {
        let (space, word) = mock.token(i);
        total += counter.count_text(&format!("{space}{word}"));
    }
    assert_eq!(total, 500);
}

#[tokio::test]
async fn max_tokens_gives_exactly_that_many_tokens_with_exact_usage() {
    let _timing = common::test_timing::timing_lock().await;
    let tokenizer = load();
    let truth_log = temp_path("tokenizer-truth.jsonl");
    let server = Server::start(MockConfig {
        ttft: Duration::from_millis(1),
        itl: Duration::ZERO,
        tokenizer: Some(Arc::clone(&tokenizer)),
        write_log: Some(truth_log.clone()),
        ..MockConfig::default()
    })
    .await;
    let prompt = "Write a short poem about the sea, the wind and the stars.";
    for max in [1u64, 11, 12, 13, 100, 1000] {
        let body = format!(
            r#"{{"model":"m","stream":true,"max_tokens":{max},"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"{prompt}"}}]}}"#
        );
        let response = request(server.addr, "POST", "/v1/chat/completions", &[], &body).await;
        assert_eq!(response.status, 200);
        let (deltas, usage) = chat_stream(&response.text());
        let text: String = deltas.concat();
        assert_eq!(tokenizer.count_text(&text), max, "max_tokens {max}");
        let usage = usage.expect("usage");
        assert_eq!(usage["completion_tokens"], max);
        let input = tokenizer
            .count_prompt("/v1/chat/completions", body.as_bytes())
            .expect("a prompt");
        assert_eq!(usage["prompt_tokens"], input);
        // Every 12th token frame carries two tokens: frames undercount the tokens.
        let expected_frames = (0..max)
            .take_while(|&k| {
                crate::metrics::Grouping::PairEvery(synth::PAIR_EVERY).tokens_of(k, max) > 0
            })
            .count();
        assert_eq!(deltas.len(), expected_frames, "max_tokens {max}");
        if max >= 13 {
            assert!((deltas.len() as u64) < max, "max_tokens {max}");
        }
        assert!(
            deltas
                .iter()
                .all(|d| matches!(tokenizer.count_text(d), 1 | 2))
        );
        assert!(response.text().contains(r#""finish_reason":"length""#));
    }
    // Not streamed: the same text in one body.
    let body =
        r#"{"model":"m","max_completion_tokens":77,"messages":[{"role":"user","content":"hi"}]}"#;
    let whole = request(server.addr, "POST", "/v1/chat/completions", &[], body).await;
    let json: serde_json::Value = serde_json::from_slice(&whole.body()).expect("json");
    let text = json["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert_eq!(tokenizer.count_text(text), 77);
    assert_eq!(json["usage"]["completion_tokens"], 77);
    // Other families' max-tokens fields.
    for (path, body) in [
        (
            "/v1/messages",
            r#"{"model":"m","stream":true,"max_tokens":25,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            "/api/chat",
            r#"{"model":"m","options":{"num_predict":25},"messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            "/v1/responses",
            r#"{"model":"m","stream":true,"max_output_tokens":25,"input":"hi"}"#,
        ),
    ] {
        let response = request(server.addr, "POST", path, &[], body).await;
        assert_eq!(response.status, 200, "{path}");
        let text = response.text();
        let reported = [
            r#""output_tokens":25"#,
            r#""eval_count":25"#,
            r#""completion_tokens":25"#,
        ];
        assert!(reported.iter().any(|r| text.contains(r)), "{path}: {text}");
    }
    server.shutdown().await;
    let truth: Vec<serde_json::Value> = std::fs::read_to_string(&truth_log)
        .expect("truth log")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let outputs: Vec<u64> = truth
        .iter()
        .map(|r| r["output_tokens"].as_u64().expect("output_tokens"))
        .collect();
    assert_eq!(outputs, [1, 11, 12, 13, 100, 1000, 77, 25, 25, 25]);
    let _ = std::fs::remove_file(&truth_log);
}

#[tokio::test]
async fn usage_off_sends_none_and_the_truth_log_still_counts() {
    // Loading a tokenizer is CPU-heavy: not beside a timing test.
    let _timing = common::test_timing::timing_lock().await;
    let truth_log = temp_path("tokenizer-off-truth.jsonl");
    let tokenizer = load();
    let server = Server::start(MockConfig {
        tokenizer: Some(Arc::clone(&tokenizer)),
        usage: UsageMode::Off,
        write_log: Some(truth_log.clone()),
        ..fast()
    })
    .await;
    let body = r#"{"model":"m","stream":true,"max_tokens":30,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    // `fast()` has `--tokens 4`: it wins over the request's max tokens.
    let response = request(server.addr, "POST", "/v1/chat/completions", &[], body).await;
    let (deltas, usage) = chat_stream(&response.text());
    assert_eq!(usage, None);
    assert_eq!(tokenizer.count_text(&deltas.concat()), 4);
    server.shutdown().await;
    let text = std::fs::read_to_string(&truth_log).expect("truth log");
    let record: serde_json::Value = serde_json::from_str(text.trim()).expect("one line");
    assert_eq!(record["output_tokens"], 4, "{record}");
    let input = tokenizer
        .count_prompt("/v1/chat/completions", body.as_bytes())
        .expect("a prompt");
    assert_eq!(record["input_tokens"], input, "{record}");
    let _ = std::fs::remove_file(&truth_log);
}

#[test]
fn the_tokenizer_flag_parses_and_a_missing_file_is_named() {
    let _timing = common::test_timing::timing_lock_blocking();
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        mock: MockArgs,
    }
    use clap::Parser as _;
    let path = tokenizer_path();
    let config = Cli::try_parse_from(["mock", "--tokenizer", path.to_str().expect("utf-8")])
        .expect("parses")
        .mock
        .into_config()
        .expect("valid");
    let tokenizer = config.tokenizer.expect("--tokenizer loaded");
    assert_eq!(tokenizer.path(), path);

    let missing = temp_path("no-such-tokenizer.json");
    let error = Cli::try_parse_from(["mock", "--tokenizer", missing.to_str().expect("utf-8")])
        .expect("parses")
        .mock
        .into_config()
        .expect_err("a missing file");
    assert!(
        matches!(error, MockError::Tokenizer(MockTokenizerError::Load { .. })),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("--tokenizer"), "{message}");
    assert!(
        message.contains(&missing.display().to_string()),
        "{message}"
    );
    // The cause says what is wrong with it.
    let mut chain = String::new();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        chain.push_str(&cause.to_string());
        source = cause.source();
    }
    assert!(chain.contains("No such file"), "{chain}");
}
