//! `llm-replay export aiperf RECORDING -o trace.jsonl`: AIPerf's `mooncake_trace` JSONL, one
//! line per exchange: `timestamp` (ms), `session_id`, the prompt as `messages` (OpenAI chat
//! shape, as the one prompt walker `common::formats::request::prompt_of` finds it: Anthropic,
//! Responses, Ollama and Bedrock bodies converted, tools included) or `text_input`, `output_length`
//! (the recorded output length, `common::measure::recorded_output_length`, else the request's
//! max tokens) and generation settings in `extra`. With `--tokenizer FILE`, the output length
//! of an answer recorded without usage is its text's token count rather than its content
//! frames (no `input_length` is written: AIPerf takes exactly one of `input_length`,
//! `text_input` and `messages`, and the prompt is exported as it was).
//!
//! Only these keys are written (AIPerf's model rejects unknown ones). Headers are never
//! exported, so no credential can leak through them; `--redact-body` applies to every string.

use std::io::Write;
use std::path::PathBuf;

use common::formats;
use common::formats::request::{self, Prompt};
use common::measure::recorded_output_length_with;
use common::recording::{Exchange, RecordingError, RecordingReader};
use common::redact::{RedactError, Redactor};
use common::tokenizer::{Tokenizer, TokenizerError};
use serde_json::{Map, Value, json};

/// `llm-replay export ...`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportArgs {
    /// Target format.
    #[arg(value_enum)]
    pub format: ExportFormat,
    /// Recording to export.
    pub recording: PathBuf,
    /// Output file.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Replace matches of REGEX in every exported string with REDACTED-<hash> (repeatable).
    #[arg(long = "redact-body", value_name = "REGEX")]
    pub redact_body: Vec<String>,
    /// A Hugging Face tokenizer.json: the output length of an answer recorded without usage
    /// is its text's token count (else one token per content frame).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// AIPerf `mooncake_trace` JSONL (use with `aiperf profile --custom-dataset-type
    /// mooncake_trace --input-file FILE`).
    Aiperf,
}

/// Generation settings copied into `extra` (shallow-merged into AIPerf's request body).
const GENERATION_KEYS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "response_format",
    "tool_choice",
    "parallel_tool_calls",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "n",
    "reasoning_effort",
];

/// What one export wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportSummary {
    pub written: u64,
    /// Exchanges with no prompt AIPerf can send (not chat, completions or messages).
    pub skipped: u64,
    pub torn_last_line: Option<u64>,
    /// Lines of the recording skipped for being longer than the reader's cap
    /// ([`common::recording::MAX_LINE_BYTES`]), so not exported; each was logged with its
    /// file and line.
    pub skipped_long_lines: u64,
}

/// A problem exporting.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Recording(#[from] RecordingError),
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the output is the recording itself; export elsewhere", path.display())]
    SameFile { path: PathBuf },
    #[error(transparent)]
    Redact(#[from] RedactError),
    #[error("--tokenizer {0}")]
    Tokenizer(#[from] TokenizerError),
}

impl ExportError {
    /// The export could not be written (rather than bad input or options).
    pub fn is_write(&self) -> bool {
        matches!(self, ExportError::Write { .. })
    }
}

/// Export `args.recording` to `args.output`.
pub fn export(args: &ExportArgs) -> Result<ExportSummary, ExportError> {
    let redactor = Redactor::new(&args.redact_body)?;
    let tokenizer = args
        .tokenizer
        .as_deref()
        .map(Tokenizer::from_file)
        .transpose()?;
    let reader = RecordingReader::open(&args.recording)?;
    let write_error = |source| ExportError::Write {
        path: args.output.clone(),
        source,
    };
    if common::recording::is_same_file(&args.recording, &args.output) {
        return Err(ExportError::SameFile {
            path: args.output.clone(),
        });
    }
    // Written beside the output and renamed into place once whole.
    let temporary = common::recording::temporary_sibling(&args.output);
    let file = std::fs::File::create(&temporary).map_err(write_error)?;
    let mut partial = RemoveOnDrop(Some(temporary.clone()));
    let mut out = std::io::BufWriter::new(file);
    let mut summary = ExportSummary::default();
    let mut reader = reader;
    for item in reader.by_ref() {
        let (line_no, exchange) = item?;
        let Some(mut line) = aiperf_line_with(&exchange, line_no, tokenizer.as_ref()) else {
            summary.skipped += 1;
            continue;
        };
        redactor.redact_json(&mut line);
        let mut text = line.to_string();
        text.push('\n');
        out.write_all(text.as_bytes()).map_err(write_error)?;
        summary.written += 1;
    }
    summary.torn_last_line = reader.torn_last_line();
    summary.skipped_long_lines = reader.skipped_lines();
    out.flush().map_err(write_error)?;
    out.get_ref().sync_all().map_err(write_error)?;
    drop(out);
    std::fs::rename(&temporary, &args.output).map_err(write_error)?;
    partial.0 = None;
    Ok(summary)
}

/// Removes a half-written temporary output when the export stops on an error.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// One `mooncake_trace` line for `exchange`, or `None` when it has no prompt (no tokenizer:
/// [`aiperf_line_with`]).
pub fn aiperf_line(exchange: &Exchange, line_no: u64) -> Option<Value> {
    aiperf_line_with(exchange, line_no, None)
}

/// One `mooncake_trace` line for `exchange`, its output length counted by `tokenizer` where
/// the recorded answer has no usage; `None` when it has no prompt.
pub fn aiperf_line_with(
    exchange: &Exchange,
    line_no: u64,
    tokenizer: Option<&Tokenizer>,
) -> Option<Value> {
    let body: Value = serde_json::from_slice(&exchange.request.body_bytes()).ok()?;
    let path = exchange.request.path.as_str();
    let family = formats::family_for_path(path);
    let mut line = Map::new();
    if let Some(at) = exchange.at_ms {
        // AIPerf accepts float milliseconds; keep microsecond resolution.
        line.insert("timestamp".into(), json!((at * 1000.0).round() / 1000.0));
    }
    if exchange.at_ms.is_none()
        && let Some(delay) = exchange.unknown.get("delay_ms").and_then(Value::as_f64)
    {
        // A mooncake import's completion-relative delay goes back where it came from.
        line.insert("delay".into(), json!(delay));
    }
    let session = exchange
        .session
        .clone()
        .or_else(|| exchange.id.clone())
        .unwrap_or_else(|| format!("line-{line_no}"));
    line.insert("session_id".into(), json!(session));
    match request::prompt_of(family, &body)? {
        Prompt::Chat(chat) => {
            let messages = chat
                .messages
                .iter()
                .map(|message| serde_json::to_value(message).unwrap_or(Value::Null))
                .collect();
            line.insert("messages".into(), Value::Array(messages));
            if let Some(tools) = chat.tools {
                line.insert("tools".into(), tools);
            }
        }
        // A batch of completions prompts is not one AIPerf request.
        Prompt::Text(mut texts) if texts.len() == 1 => {
            line.insert("text_input".into(), json!(texts.remove(0)));
        }
        Prompt::Text(_) => return None,
    }
    // The recorded length (as `--pin-output-length` asks for it), else what the request asked.
    if let Some(n) = recorded_output_length_with(exchange, tokenizer)
        .map(|length| length.tokens)
        .or_else(|| request::max_tokens(&body).map(|m| m.value))
    {
        line.insert("output_length".into(), json!(n.max(1)));
    }
    let mut extra = Map::new();
    for key in GENERATION_KEYS {
        if let Some(value) = body.get(*key) {
            extra.insert((*key).to_owned(), value.clone());
        }
    }
    if let Some(stop) = body.get("stop_sequences") {
        extra.entry("stop").or_insert_with(|| stop.clone());
    }
    if let Some(options) = body.get("options").and_then(Value::as_object) {
        for key in ["temperature", "top_p", "top_k", "seed", "stop"] {
            if let Some(value) = options.get(key) {
                extra.entry(key).or_insert_with(|| value.clone());
            }
        }
    }
    if let Some(config) = body.get("inferenceConfig").and_then(Value::as_object) {
        for (from, to) in [
            ("temperature", "temperature"),
            ("topP", "top_p"),
            ("stopSequences", "stop"),
        ] {
            if let Some(value) = config.get(from) {
                extra.entry(to).or_insert_with(|| value.clone());
            }
        }
    }
    if !extra.is_empty() {
        line.insert("extra".into(), Value::Object(extra));
    }
    Some(Value::Object(line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_body_becomes_openai_messages_with_settings() {
        let ex: Exchange = serde_json::from_value(json!({
            "at_ms": 12.5,
            "request": {"path": "/v1/messages", "headers": {"x-api-key": "sk-secret"},
                "body": json!({"model": "claude", "system": "be brief", "max_tokens": 64,
                    "temperature": 0.2, "stop_sequences": ["END"],
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}).to_string()}
        }))
        .expect("valid exchange");
        let line = aiperf_line(&ex, 1).expect("has a prompt");
        assert_eq!(line["timestamp"], json!(12.5));
        assert_eq!(
            line["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(
            line["messages"][1],
            json!({"role": "user", "content": "hi"})
        );
        assert_eq!(line["output_length"], json!(64));
        assert_eq!(line["extra"], json!({"temperature": 0.2, "stop": ["END"]}));
        assert!(!line.to_string().contains("sk-secret"));
    }

    #[test]
    fn a_responses_body_exports_its_instructions_as_the_system_message() {
        let ex: Exchange = serde_json::from_value(json!({
            "request": {"path": "/v1/responses",
                "body": json!({"model": "m", "instructions": "Answer in French.",
                    "input": "What is the capital of Peru?", "max_output_tokens": 20}).to_string()}
        }))
        .expect("valid exchange");
        let line = aiperf_line(&ex, 1).expect("has a prompt");
        assert_eq!(
            line["messages"],
            json!([{"role": "system", "content": "Answer in French."},
                   {"role": "user", "content": "What is the capital of Peru?"}])
        );
        assert!(line.get("text_input").is_none(), "{line}");
        assert_eq!(line["output_length"], json!(20));
    }

    #[test]
    fn anthropic_tool_history_and_tools_export_as_openai_messages_and_tools() {
        let ex: Exchange = serde_json::from_value(json!({
            "request": {"path": "/v1/messages",
                "body": json!({"model": "claude", "max_tokens": 8,
                    "tools": [{"name": "weather", "description": "d", "input_schema": {"type": "object"}}],
                    "messages": [
                        {"role": "user", "content": "Weather in Paris?"},
                        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                            "name": "weather", "input": {"city": "Paris"}}]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                            "content": "18 C"}]}]}).to_string()}
        }))
        .expect("valid exchange");
        let line = aiperf_line(&ex, 1).expect("has a prompt");
        assert_eq!(
            line["messages"],
            json!([{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "type": "function",
                       "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                   {"role": "tool", "content": "18 C", "tool_call_id": "t1"}])
        );
        assert_eq!(
            line["tools"],
            json!([{"type": "function", "function": {"name": "weather", "description": "d",
                "parameters": {"type": "object"}}}])
        );
    }

    #[test]
    fn the_output_length_is_the_recorded_one_else_max_tokens() {
        let body = json!({"model": "m", "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}]})
        .to_string();
        // An imported span without a response: the tokens its source counted.
        let span: Exchange = serde_json::from_value(json!({
            "request": {"path": "/v1/chat/completions", "body": body},
            "source": {"format": "otel-genai", "output_tokens": 37}
        }))
        .expect("valid exchange");
        let line = aiperf_line(&span, 1).expect("has a prompt");
        assert_eq!(line["output_length"], json!(37));
        // A recorded 400 generated nothing: what the request asked for.
        let failed: Exchange = serde_json::from_value(json!({
            "request": {"path": "/v1/chat/completions", "body": body},
            "response": {"status": 400, "frames": [{"data": "{\"error\":\"no\"}"}]}
        }))
        .expect("valid exchange");
        let line = aiperf_line(&failed, 2).expect("has a prompt");
        assert_eq!(line["output_length"], json!(100));
    }

    #[test]
    fn a_tokenizer_gives_the_output_length_of_an_answer_without_usage() {
        let frame = |t: f64, data: &str| json!({"t_ms": t, "data": data});
        let ex: Exchange = serde_json::from_value(json!({
            "request": {"path": "/v1/chat/completions", "body": json!({"stream": true, "max_tokens": 100,
                "messages": [{"role": "user", "content": "hi"}]}).to_string()},
            "response": {"status": 200, "headers": {"content-type": "text/event-stream"},
                "frames": [
                    frame(10.0, "data: {\"choices\":[{\"delta\":{\"content\":\"Hello,\"}}]}\n\n"),
                    frame(20.0, "data: {\"choices\":[{\"delta\":{\"content\":\" world!\"}}]}\n\n"),
                    frame(30.0, "data: [DONE]\n\n")]}
        }))
        .expect("valid exchange");
        let tokenizer = Tokenizer::from_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer.json"),
        )
        .expect("the test tokenizer loads");
        // "Hello, world!": 4 tokens (Python `tokenizers`), in 2 frames.
        let line = aiperf_line_with(&ex, 1, Some(&tokenizer)).expect("has a prompt");
        assert_eq!(line["output_length"], json!(4));
        assert!(
            line.get("input_length").is_none(),
            "AIPerf takes messages or input_length"
        );
        assert_eq!(
            aiperf_line(&ex, 1).expect("has a prompt")["output_length"],
            json!(2)
        );
    }

    #[test]
    fn a_bad_tokenizer_file_is_an_input_error_naming_it() {
        let dir =
            std::env::temp_dir().join(format!("llm-replay-export-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let recording = dir.join("r.jsonl");
        std::fs::write(&recording, "").expect("write");
        let bad = dir.join("bad-tokenizer.json");
        std::fs::write(&bad, "{\"model\": 1}").expect("write");
        let error = export(&ExportArgs {
            format: ExportFormat::Aiperf,
            recording,
            output: dir.join("out.jsonl"),
            redact_body: Vec::new(),
            tokenizer: Some(bad),
        })
        .expect_err("a bad tokenizer");
        assert!(!error.is_write());
        let message = error.to_string();
        assert!(message.contains("bad-tokenizer.json"), "{message}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
