//! OpenAI batch-input JSONL (`{"custom_id","method","url","body"}` per line) → requests.
//!
//! `custom_id` becomes the exchange id, `url` the path, `body` the JSON body. Batch inputs
//! have no arrival times, so `at_ms` stays absent (replay them with `--rate` or
//! `--concurrency`).

use std::io::BufRead;

use common::recording::SourceNote;
use serde::Deserialize;
use serde_json::Value;

use super::{ImportError, ImportFormat, Sink, Source, exchange, json_request};

#[derive(Debug, Deserialize)]
struct BatchLine {
    custom_id: String,
    #[serde(default = "default_method")]
    method: String,
    url: String,
    body: Value,
}

fn default_method() -> String {
    "POST".to_owned()
}

/// Import `source` into `sink`.
pub fn import(source: &Source, sink: &mut Sink) -> Result<(), ImportError> {
    let reader = source.open()?;
    for (index, line) in reader.lines().enumerate() {
        let line_no = index as u64 + 1;
        let line = line.map_err(|e| source.read_error(line_no, e))?;
        if line.trim().is_empty() {
            continue;
        }
        if !sink.wants_more() {
            break;
        }
        let mut de = serde_json::Deserializer::from_str(&line);
        let parsed: BatchLine = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = e.path().to_string();
            let field = if field == "." {
                "(line)".to_owned()
            } else {
                field
            };
            source.invalid(line_no, field, e.into_inner().to_string())
        })?;
        if !parsed.url.starts_with('/') {
            return Err(source.invalid(
                line_no,
                "url",
                format!(
                    "expected a path such as /v1/chat/completions, got {:?}",
                    parsed.url
                ),
            ));
        }
        let method = parsed.method.to_ascii_uppercase();
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(source.invalid(
                line_no,
                "method",
                format!("expected an HTTP method, got {:?}", parsed.method),
            ));
        }
        if !parsed.body.is_object() {
            return Err(source.invalid(line_no, "body", "expected a JSON object"));
        }
        let mut request = json_request(&parsed.url, &parsed.body);
        request.method = method;
        let mut ex = exchange(request);
        ex.id = Some(parsed.custom_id);
        ex.set_source_note(&SourceNote {
            line: Some(line_no),
            ..SourceNote::new(ImportFormat::OpenaiBatch.name())
        });
        sink.emit(&ex)?;
    }
    Ok(())
}
