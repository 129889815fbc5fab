//! BurstGPT CSVs → timed chat requests with synthesised prompts.
//!
//! Columns are found by header name, since releases differ in which columns they carry and
//! in what order: `Timestamp` (seconds from the trace start), `Request tokens`,
//! `Response tokens` are required; `Model` (the request's model unless `--model` is given),
//! `Log Type` and a session column (`Session ID`, `Conversation ID` or `session_id`) are used
//! when present. Rows with 0 response tokens (failed requests in BurstGPT) ask for 1 token.

use std::io::BufRead;

use common::recording::SourceNote;
use serde_json::json;

use super::{
    DEFAULT_SYNTH_MODEL, ImportError, ImportFormat, Sink, Source, Synth, csv_fields, exchange,
    json_request, synth_note, synthetic_chat_body,
};

struct Columns {
    timestamp: usize,
    request_tokens: usize,
    response_tokens: usize,
    model: Option<usize>,
    log_type: Option<usize>,
    session: Option<usize>,
}

/// Seed domain of BurstGPT prompts.
const SEED: u64 = 0x6275_7273_0000_0000;

/// Import `source` into `sink`.
pub fn import(
    source: &Source,
    sink: &mut Sink,
    synth: &Synth,
    model: Option<&str>,
) -> Result<(), ImportError> {
    let reader = source.open()?;
    let mut columns: Option<Columns> = None;
    let mut earliest: Option<f64> = None;
    for (index, line) in reader.lines().enumerate() {
        let line_no = index as u64 + 1;
        let line = line.map_err(|e| source.read_error(line_no, e))?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if !sink.wants_more() {
            break;
        }
        let fields = csv_fields(line);
        let Some(cols) = &columns else {
            let find = |names: &[&str]| {
                fields
                    .iter()
                    .position(|f| names.iter().any(|name| f.trim().eq_ignore_ascii_case(name)))
            };
            let required = |name: &str| {
                find(&[name]).ok_or_else(|| {
                    source.invalid(
                        line_no,
                        "(header)",
                        format!("no {name:?} column in the header {line:?}"),
                    )
                })
            };
            columns = Some(Columns {
                timestamp: required("Timestamp")?,
                request_tokens: required("Request tokens")?,
                response_tokens: required("Response tokens")?,
                model: find(&["Model"]),
                log_type: find(&["Log Type"]),
                session: find(&["Session ID", "Conversation ID", "session_id"]),
            });
            continue;
        };
        let field = |i: usize, name: &str| {
            fields
                .get(i)
                .map(|f| f.trim())
                .ok_or_else(|| source.invalid(line_no, name, "missing field"))
        };
        let timestamp_text = field(cols.timestamp, "Timestamp")?;
        let timestamp: f64 = timestamp_text
            .parse()
            .ok()
            .filter(|t: &f64| t.is_finite() && *t >= 0.0)
            .ok_or_else(|| {
                source.invalid(
                    line_no,
                    "Timestamp",
                    format!("expected non-negative seconds, got {timestamp_text:?}"),
                )
            })?;
        let count = |i: usize, name: &str| -> Result<u64, ImportError> {
            let text = field(i, name)?;
            // Some releases write counts as floats ("123.0").
            text.parse::<u64>()
                .ok()
                .or_else(|| {
                    text.parse::<f64>()
                        .ok()
                        .filter(|v| v.is_finite() && *v >= 0.0 && v.fract() == 0.0)
                        .map(|v| v as u64)
                })
                .ok_or_else(|| {
                    source.invalid(
                        line_no,
                        name,
                        format!("expected a non-negative integer, got {text:?}"),
                    )
                })
        };
        let request_tokens = count(cols.request_tokens, "Request tokens")?;
        let response_tokens = count(cols.response_tokens, "Response tokens")?;
        let trace_model = cols.model.and_then(|i| fields.get(i)).map(|m| m.trim());
        let model = model
            .or(trace_model.filter(|m| !m.is_empty()))
            .unwrap_or(DEFAULT_SYNTH_MODEL);
        let zero = *earliest.get_or_insert(timestamp);
        let n = usize::try_from(request_tokens).unwrap_or(usize::MAX);
        let (prompt, counted) = synth.exact_prompt(SEED ^ line_no, n);
        let body = synthetic_chat_body(model, &prompt, Some(response_tokens.max(1)));
        let mut ex = exchange(json_request("/v1/chat/completions", &body));
        ex.id = Some(format!("burstgpt-{line_no}"));
        // Rows are in time order in every release; an earlier row than the first is clamped.
        ex.at_ms = Some(((timestamp - zero) * 1000.0).max(0.0));
        ex.session = cols
            .session
            .and_then(|i| fields.get(i))
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        ex.unknown
            .insert("synth".into(), synth_note(synth, counted));
        let mut note = SourceNote {
            line: Some(line_no),
            output_tokens: Some(response_tokens),
            ..SourceNote::new(ImportFormat::Burstgpt.name())
        };
        if let Some(log_type) = cols.log_type.and_then(|i| fields.get(i)) {
            note.details
                .insert("log_type".into(), json!(log_type.trim()));
        }
        if let Some(trace_model) = trace_model {
            note.details.insert("model".into(), json!(trace_model));
        }
        ex.set_source_note(&note);
        sink.emit(&ex)?;
    }
    if columns.is_none() {
        return Err(source.invalid(1, "(header)", "the file is empty"));
    }
    Ok(())
}
