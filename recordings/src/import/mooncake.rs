//! AIPerf / Mooncake `mooncake_trace` JSONL → chat requests.
//!
//! `input_length` + `hash_ids`: the prompt is the concatenation of one block of
//! `--block-size` tokens per hash id (the same id always gives the same block, seeded by the
//! id), cut to `input_length` tokens; beyond the last block the tail is fresh text seeded by
//! the line. Blocks are decoded one by one, so requests sharing leading hash ids share a
//! byte-exact prompt prefix. `text_input` and `messages` are sent as given.
//! `output_length` → `max_tokens`; `timestamp` (ms) → `at_ms` (offset from the earliest);
//! `session_id` → `session`; `delay` is kept as `delay_ms` (the recording format has no
//! completion-relative delay).

use std::io::BufRead;

use common::recording::SourceNote;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    ImportError, ImportFormat, Sink, Source, Synth, exchange, json_request, synth_note,
    synthetic_chat_body,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceLine {
    #[serde(default)]
    timestamp: Option<f64>,
    #[serde(default)]
    input_length: Option<u64>,
    #[serde(default)]
    output_length: Option<u64>,
    #[serde(default)]
    hash_ids: Option<Vec<u64>>,
    #[serde(default)]
    text_input: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Value>>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    payload: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    delay: Option<f64>,
    #[serde(default)]
    extra: Option<serde_json::Map<String, Value>>,
}

/// Seed domains, so a hash id's block and a line's fresh tail never share a generator.
const BLOCK_SEED: u64 = 0x6d6f_6f6e_0000_0000;
const TAIL_SEED: u64 = 0x7461_696c_0000_0000;

/// Import `source` into `sink`.
pub fn import(
    source: &Source,
    sink: &mut Sink,
    synth: &Synth,
    model: &str,
    block_size: usize,
) -> Result<(), ImportError> {
    // Pass 1: the schedule's zero is the earliest timestamp (AIPerf's auto offset).
    let mut earliest = f64::INFINITY;
    for_each_line(source, &mut |_, line| {
        if let Some(t) = line.timestamp {
            earliest = earliest.min(t);
        }
        Ok(true)
    })?;
    let mut tokens: Vec<u32> = Vec::new();
    let mut block: Vec<u32> = Vec::with_capacity(block_size);
    for_each_line(source, &mut |line_no, line| {
        if !sink.wants_more() {
            return Ok(false);
        }
        let mut synthesized = None;
        let mut body = if let Some(payload) = &line.payload {
            Value::Object(payload.clone())
        } else if let Some(messages) = &line.messages {
            let mut body = json!({
                "model": model,
                "messages": messages,
                "stream": true,
                "stream_options": {"include_usage": true},
            });
            if let Some(tools) = &line.tools {
                body["tools"] = json!(tools);
            }
            body
        } else if let Some(text) = &line.text_input {
            synthetic_chat_body(model, text, None)
        } else if let Some(input_length) = line.input_length {
            let n = usize::try_from(input_length).unwrap_or(usize::MAX);
            let (prompt, count) = prompt_for(
                synth,
                line.hash_ids.as_deref().unwrap_or(&[]),
                n,
                block_size,
                line_no,
                &mut tokens,
                &mut block,
            );
            synthesized = Some(count);
            synthetic_chat_body(model, &prompt, None)
        } else {
            return Err(source.invalid(
                line_no,
                "input_length",
                "expected one of input_length, text_input, messages or payload",
            ));
        };
        if let Some(output_length) = line.output_length
            && line.payload.is_none()
        {
            body["max_tokens"] = json!(output_length.max(1));
        }
        if let Some(extra) = &line.extra
            && let Some(object) = body.as_object_mut()
        {
            for (key, value) in extra {
                object.insert(key.clone(), value.clone());
            }
        }
        let mut ex = exchange(json_request("/v1/chat/completions", &body));
        ex.id = Some(format!("mooncake-{line_no}"));
        ex.session = line.session_id.clone();
        ex.at_ms = line.timestamp.map(|t| t - earliest);
        if let Some(delay) = line.delay {
            ex.unknown.insert("delay_ms".into(), json!(delay));
        }
        if let Some(count) = synthesized {
            ex.unknown.insert("synth".into(), synth_note(synth, count));
        }
        let mut note = SourceNote::new(ImportFormat::Mooncake.name());
        note.line = Some(line_no);
        if let Some(n) = line.input_length {
            note.details.insert("input_length".into(), json!(n));
        }
        if let Some(n) = line.output_length {
            note.details.insert("output_length".into(), json!(n));
        }
        ex.set_source_note(&note);
        sink.emit(&ex)?;
        Ok(true)
    })
}

/// The prompt of one `input_length`/`hash_ids` line and its token count by construction
/// (the number of token ids decoded).
pub fn prompt_for(
    synth: &Synth,
    hash_ids: &[u64],
    input_length: usize,
    block_size: usize,
    line_no: u64,
    tokens: &mut Vec<u32>,
    block: &mut Vec<u32>,
) -> (String, usize) {
    let mut text = String::new();
    tokens.clear();
    for hash_id in hash_ids {
        if tokens.len() >= input_length {
            break;
        }
        block.clear();
        synth.push_block(BLOCK_SEED ^ hash_id, block_size, block);
        let take = block_size.min(input_length - tokens.len());
        text.push_str(&synth.decode(&block[..take]));
        tokens.extend_from_slice(&block[..take]);
    }
    if tokens.len() < input_length {
        block.clear();
        synth.push_block(TAIL_SEED ^ line_no, input_length - tokens.len(), block);
        text.push_str(&synth.decode(block));
        tokens.extend_from_slice(block);
    }
    (text, tokens.len())
}

fn for_each_line(
    source: &Source,
    on_line: &mut dyn FnMut(u64, TraceLine) -> Result<bool, ImportError>,
) -> Result<(), ImportError> {
    let reader = source.open()?;
    for (index, line) in reader.lines().enumerate() {
        let line_no = index as u64 + 1;
        let line = line.map_err(|e| source.read_error(line_no, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let mut de = serde_json::Deserializer::from_str(&line);
        let parsed: TraceLine = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = e.path().to_string();
            let field = if field == "." {
                "(line)".to_owned()
            } else {
                field
            };
            source.invalid(line_no, field, e.into_inner().to_string())
        })?;
        if let Some(t) = parsed.timestamp
            && !(t.is_finite() && t >= 0.0)
        {
            return Err(source.invalid(
                line_no,
                "timestamp",
                format!("expected a non-negative number of milliseconds, got {t}"),
            ));
        }
        if !on_line(line_no, parsed)? {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::TokenizerName;
    use super::*;

    #[test]
    fn shared_leading_hash_ids_share_the_prompt_prefix() {
        let synth = Synth::from_path(TokenizerName::O200kBase, None).expect("built-in");
        let (mut t, mut b) = (Vec::new(), Vec::new());
        let (a, na) = prompt_for(&synth, &[0, 1, 2], 1400, 512, 1, &mut t, &mut b);
        let (c, nc) = prompt_for(&synth, &[0, 1, 9], 1300, 512, 2, &mut t, &mut b);
        assert_eq!((na, nc), (1400, 1300));
        let (a2, _) = prompt_for(&synth, &[0, 1], 1024, 512, 3, &mut t, &mut b);
        assert!(a.starts_with(&a2) && c.starts_with(&a2));
        assert_ne!(a[a2.len()..a2.len() + 40], c[a2.len()..a2.len() + 40]);
        for (text, n) in [(a, na), (c, nc)] {
            let counted = synth.count(&text) as f64;
            assert!(
                (counted - n as f64).abs() / (n as f64) < 0.02,
                "{counted} vs {n}"
            );
        }
    }
}
