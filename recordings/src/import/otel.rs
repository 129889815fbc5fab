//! OpenTelemetry GenAI semantic-convention spans in OTLP JSON → streamed OpenAI chat requests.
//!
//! Input: the OTLP/JSON exporter's and the collector file exporter's form,
//! `{"resourceSpans":[{"scopeSpans":[{"spans":[...]}]}]}`, either one document per file
//! (pretty-printed or not) or one document per line.
//!
//! A span is an LLM call when it has `gen_ai.operation.name` = `chat`, `text_completion` or
//! `generate_content`, or (without an operation name) `gen_ai.system` / `gen_ai.provider.name`;
//! other spans are skipped and counted. The prompt is read, first form found wins, from:
//! 1. `gen_ai.system_instructions` + `gen_ai.input.messages` (JSON string or array value;
//!    `parts` of type `text`, `tool_call`, `tool_call_response`);
//! 2. span events `gen_ai.system.message`, `gen_ai.user.message`, `gen_ai.assistant.message`,
//!    `gen_ai.tool.message` with `content` (or `gen_ai.event.content` / `body`, JSON or text)
//!    in the event attributes;
//! 3. indexed attributes `gen_ai.prompt.N.role` / `gen_ai.prompt.N.content`.
//!
//! Settings: `gen_ai.request.model` → `model`, `.max_tokens`, `.temperature`, `.top_p`,
//! `.frequency_penalty`, `.presence_penalty`, `.seed`, `.stop_sequences` → `stop`,
//! `.choice.count` → `n`. The body always streams with `stream_options.include_usage`.
//!
//! `at_ms` = `startTimeUnixNano` − the earliest imported span's; `session` =
//! `gen_ai.conversation.id`, else the trace id. What the span measured goes in the exchange's
//! `source` note (as the other importers without frames do): `output_tokens`
//! (`gen_ai.usage.output_tokens`, older `completion_tokens`), `input_tokens`
//! (`gen_ai.usage.input_tokens`, older `prompt_tokens`), `duration_ms` (end − start) and
//! `ttft_ms`: the first span event whose name contains `first_token` / `first-token` (or is
//! `gen_ai.content.completion`) minus the start, else an attribute
//! `gen_ai.response.time_to_first_token` / `gen_ai.server.time_to_first_token` (seconds) or
//! one of those names with `_ms` (milliseconds). No response is written: the span holds no
//! stream to replay, and nothing is invented. Spans without a prompt are not imported and are
//! counted; spans without a model or usage are imported and counted.

use std::collections::BTreeMap;

use common::recording::SourceNote;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::{ImportError, ImportFormat, Sink, Source, exchange, json_request};

/// What one import read, for the CLI's summary.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OtelSummary {
    pub spans: u64,
    pub imported: u64,
    pub skipped_not_llm: u64,
    pub skipped_no_prompt: u64,
    pub missing_model: u64,
    pub missing_usage: u64,
    pub missing_ttft: u64,
}

impl OtelSummary {
    /// One line per fact, for stderr.
    pub fn lines(&self) -> Vec<String> {
        vec![
            format!(
                "otel-genai: {} spans read, {} LLM spans imported, {} non-LLM spans skipped, {} LLM spans without a prompt skipped",
                self.spans, self.imported, self.skipped_not_llm, self.skipped_no_prompt
            ),
            format!(
                "otel-genai: of those imported, {} lack gen_ai.request.model, {} lack output usage, {} lack a first-token time",
                self.missing_model, self.missing_usage, self.missing_ttft
            ),
        ]
    }
}

#[derive(Deserialize)]
struct Document<'a> {
    #[serde(rename = "resourceSpans", default, borrow)]
    resource_spans: Vec<ResourceSpans<'a>>,
}

#[derive(Deserialize)]
struct ResourceSpans<'a> {
    #[serde(rename = "scopeSpans", default, borrow)]
    scope_spans: Vec<ScopeSpans<'a>>,
}

#[derive(Deserialize)]
struct ScopeSpans<'a> {
    #[serde(default, borrow)]
    spans: Vec<&'a RawValue>,
}

/// One LLM span turned into an exchange, before `at_ms` is known.
struct Call {
    start_ns: u64,
    order: usize,
    exchange: common::recording::Exchange,
}

/// Import `source` into `sink`; returns what was read.
pub fn import(source: &Source, sink: &mut Sink) -> Result<OtelSummary, ImportError> {
    let text = std::fs::read_to_string(&source.path).map_err(|e| source.read_error(0, e))?;
    let mut summary = OtelSummary::default();
    let mut calls = Vec::new();
    let whole = serde_json::from_str::<Document>(&text);
    match whole {
        Ok(doc) => read_document(source, &text, &doc, &mut summary, &mut calls)?,
        Err(whole_error) => {
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            if serde_json::from_str::<Value>(first).is_err() {
                return Err(source.invalid(
                    whole_error.line() as u64,
                    "(file)",
                    format!("not an OTLP JSON document: {whole_error}"),
                ));
            }
            for (index, line) in text.split_inclusive('\n').enumerate() {
                let line_no = index as u64 + 1;
                let body = line.trim();
                if !body.is_empty() {
                    let doc: Document = serde_json::from_str(body).map_err(|e| {
                        source.invalid(line_no, "(line)", format!("not an OTLP JSON document: {e}"))
                    })?;
                    read_document(source, &text, &doc, &mut summary, &mut calls)?;
                }
            }
        }
    }
    calls.sort_by_key(|c| (c.start_ns, c.order));
    let earliest = calls.first().map(|c| c.start_ns).unwrap_or(0);
    for mut call in calls {
        if !sink.wants_more() {
            break;
        }
        call.exchange.at_ms = Some((call.start_ns - earliest) as f64 / 1e6);
        sink.emit(&call.exchange)?;
    }
    Ok(summary)
}

/// The 1-based line where `part` (a slice of `text`) starts; 0 when it is not a slice of it.
fn line_of(text: &str, part: &str) -> u64 {
    let offset = (part.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
    match text.get(..offset) {
        Some(before) => before.bytes().filter(|b| *b == b'\n').count() as u64 + 1,
        None => 0,
    }
}

fn read_document(
    source: &Source,
    text: &str,
    doc: &Document<'_>,
    summary: &mut OtelSummary,
    calls: &mut Vec<Call>,
) -> Result<(), ImportError> {
    for (r, resource) in doc.resource_spans.iter().enumerate() {
        for (s, scope) in resource.scope_spans.iter().enumerate() {
            for (i, raw) in scope.spans.iter().enumerate() {
                summary.spans += 1;
                let line = line_of(text, raw.get());
                let at = Where {
                    source,
                    line,
                    prefix: format!("resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"),
                };
                let span: Value = serde_json::from_str(raw.get())
                    .map_err(|e| at.invalid("", format!("not a span: {e}")))?;
                if let Some(call) = read_span(&at, &span, calls.len(), summary)? {
                    calls.push(call);
                }
            }
        }
    }
    Ok(())
}

/// A span's position, for errors.
struct Where<'a> {
    source: &'a Source,
    line: u64,
    prefix: String,
}

impl Where<'_> {
    fn invalid(&self, field: &str, message: impl Into<String>) -> ImportError {
        let field = if field.is_empty() {
            self.prefix.clone()
        } else {
            format!("{}.{field}", self.prefix)
        };
        self.source.invalid(self.line, field, message)
    }
}

/// OTLP JSON `AnyValue` → plain JSON.
fn any_value(value: &Value) -> Value {
    let Some(object) = value.as_object() else {
        return value.clone();
    };
    if let Some(v) = object.get("stringValue") {
        return v.clone();
    }
    if let Some(v) = object.get("intValue") {
        return match v {
            Value::String(s) => s.parse::<i64>().map(Value::from).unwrap_or(v.clone()),
            other => other.clone(),
        };
    }
    if let Some(v) = object.get("doubleValue") {
        return v.clone();
    }
    if let Some(v) = object.get("boolValue") {
        return v.clone();
    }
    if let Some(v) = object.get("bytesValue") {
        return v.clone();
    }
    if let Some(array) = object.get("arrayValue") {
        return Value::Array(
            array["values"]
                .as_array()
                .map(|values| values.iter().map(any_value).collect())
                .unwrap_or_default(),
        );
    }
    if let Some(list) = object.get("kvlistValue") {
        return Value::Object(attributes(&list["values"]).into_iter().collect());
    }
    Value::Null
}

/// OTLP `[{key, value}]` → map.
fn attributes(list: &Value) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for item in list.as_array().into_iter().flatten() {
        if let Some(key) = item["key"].as_str() {
            map.insert(key.to_owned(), any_value(&item["value"]));
        }
    }
    map
}

/// A `*UnixNano` field: a decimal string (proto3 JSON for 64-bit integers) or a number.
fn nanos(at: &Where<'_>, value: &Value, field: &str) -> Result<Option<u64>, ImportError> {
    match value {
        Value::Null => Ok(None),
        Value::String(s) => s.parse::<u64>().map(Some).map_err(|_| {
            at.invalid(
                field,
                format!("expected nanoseconds since the epoch, got {s:?}"),
            )
        }),
        Value::Number(n) => n.as_u64().map(Some).ok_or_else(|| {
            at.invalid(
                field,
                format!("expected nanoseconds since the epoch, got {n}"),
            )
        }),
        other => Err(at.invalid(
            field,
            format!("expected nanoseconds since the epoch, got {other}"),
        )),
    }
}

fn as_u64(value: Option<&Value>) -> Option<u64> {
    match value? {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| *f >= 0.0 && f.fract() == 0.0)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn as_f64(value: Option<&Value>) -> Option<f64> {
    match value? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

const LLM_OPERATIONS: [&str; 3] = ["chat", "text_completion", "generate_content"];

fn read_span(
    at: &Where<'_>,
    span: &Value,
    order: usize,
    summary: &mut OtelSummary,
) -> Result<Option<Call>, ImportError> {
    if !span.is_object() {
        return Err(at.invalid("", "expected a span object"));
    }
    let attrs = attributes(&span["attributes"]);
    let operation = attrs.get("gen_ai.operation.name").and_then(Value::as_str);
    let is_llm = match operation {
        Some(op) => LLM_OPERATIONS.contains(&op),
        None => attrs.contains_key("gen_ai.system") || attrs.contains_key("gen_ai.provider.name"),
    };
    if !is_llm {
        summary.skipped_not_llm += 1;
        return Ok(None);
    }
    let start_ns = nanos(at, &span["startTimeUnixNano"], "startTimeUnixNano")?
        .ok_or_else(|| at.invalid("startTimeUnixNano", "missing: an LLM span needs its start"))?;
    let end_ns = nanos(at, &span["endTimeUnixNano"], "endTimeUnixNano")?;
    let events: Vec<(String, Option<u64>, BTreeMap<String, Value>)> = span["events"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(e, event)| {
            let time = nanos(
                at,
                &event["timeUnixNano"],
                &format!("events[{e}].timeUnixNano"),
            )?;
            Ok((
                event["name"].as_str().unwrap_or("").to_owned(),
                time,
                attributes(&event["attributes"]),
            ))
        })
        .collect::<Result<_, ImportError>>()?;

    let messages = input_messages(at, &attrs)?
        .or_else(|| event_messages(&events))
        .or_else(|| indexed_messages(&attrs));
    let Some(messages) = messages else {
        summary.skipped_no_prompt += 1;
        return Ok(None);
    };

    let mut body = Map::new();
    match attrs.get("gen_ai.request.model").and_then(Value::as_str) {
        Some(model) => {
            body.insert("model".into(), json!(model));
        }
        None => summary.missing_model += 1,
    }
    body.insert("messages".into(), Value::Array(messages));
    for (attr, key) in [
        ("gen_ai.request.max_tokens", "max_tokens"),
        ("gen_ai.request.seed", "seed"),
        ("gen_ai.request.choice.count", "n"),
    ] {
        if let Some(v) = as_u64(attrs.get(attr)) {
            body.insert(key.into(), json!(v));
        }
    }
    for (attr, key) in [
        ("gen_ai.request.temperature", "temperature"),
        ("gen_ai.request.top_p", "top_p"),
        ("gen_ai.request.frequency_penalty", "frequency_penalty"),
        ("gen_ai.request.presence_penalty", "presence_penalty"),
    ] {
        if let Some(v) = as_f64(attrs.get(attr)) {
            body.insert(key.into(), json!(v));
        }
    }
    match attrs.get("gen_ai.request.stop_sequences") {
        Some(Value::Array(stops)) if !stops.is_empty() => {
            body.insert("stop".into(), Value::Array(stops.clone()));
        }
        Some(Value::String(stop)) => {
            body.insert("stop".into(), json!([stop]));
        }
        _ => {}
    }
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));

    let trace_id = span["traceId"].as_str().unwrap_or("").to_owned();
    let span_id = span["spanId"].as_str().unwrap_or("").to_owned();
    let mut ex = exchange(json_request("/v1/chat/completions", &Value::Object(body)));
    ex.id = (!span_id.is_empty()).then(|| format!("otel-{span_id}"));
    ex.session = attrs
        .get("gen_ai.conversation.id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| (!trace_id.is_empty()).then(|| trace_id.clone()));

    let mut note = SourceNote::new(ImportFormat::OtelGenai.name());
    note.line = Some(at.line);
    note.details.insert("trace_id".into(), json!(trace_id));
    note.details.insert("span_id".into(), json!(span_id));
    if let Some(name) = span["name"].as_str() {
        note.details.insert("span_name".into(), json!(name));
    }
    note.output_tokens = as_u64(attrs.get("gen_ai.usage.output_tokens"))
        .or_else(|| as_u64(attrs.get("gen_ai.usage.completion_tokens")));
    if note.output_tokens.is_none() {
        summary.missing_usage += 1;
    }
    note.input_tokens = as_u64(attrs.get("gen_ai.usage.input_tokens"))
        .or_else(|| as_u64(attrs.get("gen_ai.usage.prompt_tokens")));
    note.duration_ms = end_ns
        .filter(|end| *end >= start_ns)
        .map(|end| (end - start_ns) as f64 / 1e6);
    note.ttft_ms = first_token_ms(start_ns, &events, &attrs);
    if note.ttft_ms.is_none() {
        summary.missing_ttft += 1;
    }
    ex.set_source_note(&note);
    summary.imported += 1;
    Ok(Some(Call {
        start_ns,
        order,
        exchange: ex,
    }))
}

/// First-token time in ms after the span's start, where the span records it.
fn first_token_ms(
    start_ns: u64,
    events: &[(String, Option<u64>, BTreeMap<String, Value>)],
    attrs: &BTreeMap<String, Value>,
) -> Option<f64> {
    let first_token_event = |name: &str| {
        let lower = name.to_ascii_lowercase();
        lower.contains("first_token") || lower.contains("first-token")
    };
    let from_event = |pick: &dyn Fn(&str) -> bool| {
        events
            .iter()
            .filter(|(name, _, _)| pick(name))
            .find_map(|(_, time, _)| time.filter(|t| *t >= start_ns))
            .map(|t| (t - start_ns) as f64 / 1e6)
    };
    from_event(&first_token_event)
        .or_else(|| {
            [
                "gen_ai.response.time_to_first_token",
                "gen_ai.server.time_to_first_token",
            ]
            .iter()
            .find_map(|name| {
                as_f64(attrs.get(*name))
                    .map(|s| s * 1000.0)
                    .or_else(|| as_f64(attrs.get(&format!("{name}_ms"))))
            })
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
        })
        .or_else(|| from_event(&|name: &str| name == "gen_ai.content.completion"))
}

/// A JSON-string attribute parsed, or the structured value as it is.
fn json_attr(
    at: &Where<'_>,
    attrs: &BTreeMap<String, Value>,
    name: &str,
) -> Result<Option<Value>, ImportError> {
    match attrs.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => serde_json::from_str(s)
            .map(Some)
            .map_err(|e| at.invalid(&format!("attributes[{name}]"), format!("not JSON: {e}"))),
        Some(other) => Ok(Some(other.clone())),
    }
}

/// `gen_ai.system_instructions` + `gen_ai.input.messages` (the current conventions).
fn input_messages(
    at: &Where<'_>,
    attrs: &BTreeMap<String, Value>,
) -> Result<Option<Vec<Value>>, ImportError> {
    let Some(input) = json_attr(at, attrs, "gen_ai.input.messages")? else {
        return Ok(None);
    };
    let field = "attributes[gen_ai.input.messages]";
    let list = input
        .as_array()
        .ok_or_else(|| at.invalid(field, "expected an array of messages"))?;
    let mut messages = Vec::new();
    if let Some(system) = json_attr(at, attrs, "gen_ai.system_instructions")? {
        let text = match &system {
            Value::Array(parts) => text_of_parts(parts),
            Value::String(s) => s.clone(),
            _ => String::new(),
        };
        if !text.is_empty() {
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    for (i, message) in list.iter().enumerate() {
        let role = message["role"]
            .as_str()
            .ok_or_else(|| at.invalid(&format!("{field}[{i}].role"), "expected a role"))?;
        let parts = message["parts"].as_array().cloned().unwrap_or_default();
        let text = match message.get("content") {
            Some(Value::String(s)) if parts.is_empty() => s.clone(),
            _ => text_of_parts(&parts),
        };
        let tool_calls: Vec<Value> = parts
            .iter()
            .filter(|p| p["type"] == "tool_call")
            .map(|p| {
                let arguments = match &p["arguments"] {
                    Value::String(s) => s.clone(),
                    Value::Null => "{}".to_owned(),
                    other => other.to_string(),
                };
                json!({"id": p["id"], "type": "function",
                       "function": {"name": p["name"], "arguments": arguments}})
            })
            .collect();
        let responses: Vec<&Value> = parts
            .iter()
            .filter(|p| p["type"] == "tool_call_response")
            .collect();
        if !responses.is_empty() {
            for p in responses {
                let content = match &p["response"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                messages.push(json!({"role": "tool", "tool_call_id": p["id"], "content": content}));
            }
            continue;
        }
        let mut out = json!({"role": role, "content": text});
        if !tool_calls.is_empty() {
            out["tool_calls"] = Value::Array(tool_calls);
            if text.is_empty() {
                out["content"] = Value::Null;
            }
        }
        messages.push(out);
    }
    Ok((!messages.is_empty()).then_some(messages))
}

/// The text parts of a message, joined.
fn text_of_parts(parts: &[Value]) -> String {
    parts
        .iter()
        .filter(|p| p["type"] == "text" || p.get("type").is_none())
        .filter_map(|p| p["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The older per-message span events.
fn event_messages(events: &[(String, Option<u64>, BTreeMap<String, Value>)]) -> Option<Vec<Value>> {
    let mut messages = Vec::new();
    for (name, _, attrs) in events {
        let role = match name.as_str() {
            "gen_ai.system.message" => "system",
            "gen_ai.user.message" => "user",
            "gen_ai.assistant.message" => "assistant",
            "gen_ai.tool.message" => "tool",
            _ => continue,
        };
        let role = attrs.get("role").and_then(Value::as_str).unwrap_or(role);
        // The body, when an instrumentation flattened it into one attribute.
        let body = ["gen_ai.event.content", "body"]
            .iter()
            .find_map(|k| attrs.get(*k))
            .map(|v| match v {
                Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| v.clone()),
                other => other.clone(),
            });
        let content = attrs
            .get("content")
            .cloned()
            .or_else(|| match &body {
                Some(Value::Object(o)) => o.get("content").cloned(),
                Some(Value::String(s)) => Some(json!(s)),
                _ => None,
            })
            .unwrap_or(Value::Null);
        let content = match content {
            Value::String(s) => json!(s),
            Value::Null => json!(""),
            other => json!(other.to_string()),
        };
        let mut message = json!({"role": role, "content": content});
        let id = attrs
            .get("id")
            .cloned()
            .or_else(|| body.as_ref().and_then(|b| b.get("id").cloned()));
        if role == "tool"
            && let Some(id) = id
        {
            message["tool_call_id"] = id;
        }
        messages.push(message);
    }
    (!messages.is_empty()).then_some(messages)
}

/// The older indexed attributes `gen_ai.prompt.N.role` / `.content`.
fn indexed_messages(attrs: &BTreeMap<String, Value>) -> Option<Vec<Value>> {
    let mut messages = Vec::new();
    for n in 0.. {
        let role = attrs.get(&format!("gen_ai.prompt.{n}.role"));
        let content = attrs.get(&format!("gen_ai.prompt.{n}.content"));
        if role.is_none() && content.is_none() {
            break;
        }
        let role = role.and_then(Value::as_str).unwrap_or("user");
        let content = content.and_then(Value::as_str).unwrap_or("");
        messages.push(json!({"role": role, "content": content}));
    }
    (!messages.is_empty()).then_some(messages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("llm-replay-otel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir.join(name)
    }

    /// Import `text` (written to a file); the exchanges, or the error.
    fn run(name: &str, text: &str) -> Result<(OtelSummary, Vec<Value>), ImportError> {
        let input = temp(&format!("{name}.json"));
        let output = temp(&format!("{name}.out.jsonl"));
        std::fs::write(&input, text).expect("write input");
        let source = Source { path: input };
        let mut sink = Sink::create(&output, None).expect("sink");
        let summary = import(&source, &mut sink)?;
        sink.finish().expect("finish");
        let exchanges = common::recording::read_all(&output)
            .expect("valid recording")
            .into_iter()
            .map(|ex| serde_json::to_value(&ex).expect("json"))
            .collect();
        Ok((summary, exchanges))
    }

    fn body(exchange: &Value) -> Value {
        serde_json::from_str(exchange["request"]["body"].as_str().expect("text body"))
            .expect("JSON body")
    }

    fn doc(spans: &[Value]) -> String {
        json!({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).to_string()
    }

    fn attr(key: &str, value: Value) -> Value {
        let value = match value {
            Value::String(s) => json!({"stringValue": s}),
            Value::Number(n) if n.is_f64() => json!({"doubleValue": n}),
            Value::Number(n) => json!({"intValue": n.to_string()}),
            other => other,
        };
        json!({"key": key, "value": value})
    }

    fn span(start_ns: u64, attributes: Vec<Value>, events: Vec<Value>) -> Value {
        json!({
            "traceId": format!("{start_ns:032x}"),
            "spanId": format!("{start_ns:016x}"),
            "name": "chat m",
            "startTimeUnixNano": start_ns.to_string(),
            "endTimeUnixNano": (start_ns + 500_000_000).to_string(),
            "attributes": attributes,
            "events": events,
        })
    }

    #[test]
    fn input_messages_attribute_and_settings() {
        let s = span(
            2_000_000_000,
            vec![
                attr("gen_ai.operation.name", json!("chat")),
                attr("gen_ai.request.model", json!("m1")),
                attr("gen_ai.request.max_tokens", json!(32)),
                attr("gen_ai.request.temperature", json!(0.5)),
                attr("gen_ai.request.top_p", json!(0.75)),
                attr(
                    "gen_ai.request.stop_sequences",
                    json!({"arrayValue": {"values": [{"stringValue": "END"}]}}),
                ),
                attr("gen_ai.conversation.id", json!("c1")),
                attr(
                    "gen_ai.input.messages",
                    json!(r#"[{"role":"user","parts":[{"type":"text","content":"hello there"}]}]"#),
                ),
                attr("gen_ai.usage.input_tokens", json!(7)),
                attr("gen_ai.usage.output_tokens", json!(11)),
                attr("gen_ai.response.time_to_first_token", json!(0.125)),
            ],
            vec![],
        );
        let (summary, exchanges) = run("input", &doc(&[s])).expect("imports");
        assert_eq!(summary.imported, 1);
        let ex = &exchanges[0];
        assert_eq!(ex["session"], "c1");
        assert_eq!(ex["at_ms"], 0.0);
        assert_eq!(
            body(ex),
            json!({"model": "m1", "max_tokens": 32, "temperature": 0.5, "top_p": 0.75,
                   "stop": ["END"], "stream": true, "stream_options": {"include_usage": true},
                   "messages": [{"role": "user", "content": "hello there"}]})
        );
        assert_eq!(ex["source"]["output_tokens"], 11);
        assert_eq!(ex["source"]["input_tokens"], 7);
        assert_eq!(ex["source"]["ttft_ms"], 125.0);
        assert_eq!(ex["source"]["duration_ms"], 500.0);
        assert!(ex.get("response").is_none(), "nothing invented: {ex}");
    }

    #[test]
    fn message_events_first_token_event_and_trace_session() {
        let start = 5_000_000_000u64;
        let s = span(
            start,
            vec![
                attr("gen_ai.system", json!("openai")),
                attr("gen_ai.request.model", json!("m")),
                attr("gen_ai.usage.completion_tokens", json!(4)),
            ],
            vec![
                json!({"name": "gen_ai.system.message", "timeUnixNano": start.to_string(),
                       "attributes": [attr("content", json!("be brief"))]}),
                json!({"name": "gen_ai.user.message", "timeUnixNano": start.to_string(),
                       "attributes": [attr("gen_ai.event.content", json!(r#"{"content":"hi"}"#))]}),
                json!({"name": "gen_ai.first_token",
                       "timeUnixNano": (start + 80_000_000).to_string()}),
            ],
        );
        let (_, exchanges) = run("events", &doc(&[s])).expect("imports");
        let ex = &exchanges[0];
        assert_eq!(
            body(ex)["messages"],
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
        );
        assert_eq!(ex["session"], format!("{start:032x}"));
        assert_eq!(ex["source"]["ttft_ms"], 80.0);
        assert_eq!(ex["source"]["output_tokens"], 4);
    }

    #[test]
    fn indexed_prompt_attributes_one_document_per_line_and_counts() {
        let indexed = span(
            1_000_000_000,
            vec![
                attr("gen_ai.operation.name", json!("text_completion")),
                attr("gen_ai.prompt.0.role", json!("user")),
                attr("gen_ai.prompt.0.content", json!("first")),
                attr("gen_ai.prompt.1.role", json!("assistant")),
                attr("gen_ai.prompt.1.content", json!("second")),
            ],
            vec![],
        );
        let no_prompt = span(
            1_500_000_000,
            vec![attr("gen_ai.operation.name", json!("chat"))],
            vec![],
        );
        let other = span(
            1_200_000_000,
            vec![attr("http.request.method", json!("GET"))],
            vec![],
        );
        let embeddings = span(
            1_300_000_000,
            vec![
                attr("gen_ai.operation.name", json!("embeddings")),
                attr("gen_ai.system", json!("openai")),
            ],
            vec![],
        );
        let text = format!(
            "{}\n\n{}\n",
            doc(&[indexed, other]),
            doc(&[no_prompt, embeddings])
        );
        let (summary, exchanges) = run("lines", &text).expect("imports");
        assert_eq!(
            summary,
            OtelSummary {
                spans: 4,
                imported: 1,
                skipped_not_llm: 2,
                skipped_no_prompt: 1,
                missing_model: 1,
                missing_usage: 1,
                missing_ttft: 1,
            }
        );
        let b = body(&exchanges[0]);
        assert_eq!(
            b["messages"],
            json!([{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"}])
        );
        assert!(b.get("model").is_none(), "no model invented: {b}");
        assert!(exchanges[0]["source"].get("output_tokens").is_none());
        assert_eq!(exchanges[0]["source"]["line"], 1);
    }

    #[test]
    fn at_ms_is_relative_to_the_earliest_span_and_sorted() {
        let mk = |start: u64, text: &str| {
            span(
                start,
                vec![
                    attr("gen_ai.operation.name", json!("chat")),
                    attr("gen_ai.prompt.0.content", json!(text)),
                ],
                vec![],
            )
        };
        let (_, exchanges) = run(
            "order",
            &doc(&[mk(3_250_000_000, "late"), mk(1_000_000_000, "early")]),
        )
        .expect("imports");
        assert_eq!(exchanges[0]["at_ms"], 0.0);
        assert_eq!(exchanges[1]["at_ms"], 2250.0);
        assert_eq!(body(&exchanges[1])["messages"][0]["content"], "late");
    }

    #[test]
    fn bad_input_names_file_line_and_field() {
        let good = span(
            1,
            vec![
                attr("gen_ai.operation.name", json!("chat")),
                attr("gen_ai.prompt.0.content", json!("x")),
            ],
            vec![],
        );
        let mut bad = good.clone();
        bad["startTimeUnixNano"] = json!("soon");
        let text = format!("{}\n{}\n", doc(std::slice::from_ref(&good)), doc(&[bad]));
        let error = run("badtime", &text).expect_err("bad start").to_string();
        assert!(
            error.contains(
                "badtime.json:2: resourceSpans[0].scopeSpans[0].spans[0].startTimeUnixNano:"
            ),
            "{error}"
        );

        let mut bad_json = good.clone();
        bad_json["attributes"] = json!([
            attr("gen_ai.operation.name", json!("chat")),
            attr("gen_ai.input.messages", json!("[{oops"))
        ]);
        let pretty = serde_json::to_string_pretty(
            &json!({"resourceSpans": [{"scopeSpans": [{"spans": [good, bad_json]}]}]}),
        )
        .expect("pretty");
        // Spans are the objects at 12 spaces of indent in the pretty form.
        let span_starts: Vec<usize> = pretty
            .lines()
            .enumerate()
            .filter(|(_, l)| *l == "            {")
            .map(|(i, _)| i + 1)
            .collect();
        assert_eq!(span_starts.len(), 2, "{pretty}");
        let line = span_starts[1];
        let error = run("badmsg", &pretty)
            .expect_err("bad messages")
            .to_string();
        assert!(
            error.contains(&format!(
                "badmsg.json:{line}: resourceSpans[0].scopeSpans[0].spans[1].attributes[gen_ai.input.messages]: not JSON"
            )),
            "{error}\n{pretty}"
        );

        let error = run("notjson", "{\n  \"resourceSpans\": [\n  oops\n")
            .expect_err("not JSON")
            .to_string();
        assert!(
            error.contains("notjson.json:3: (file): not an OTLP JSON document"),
            "{error}"
        );
    }
}
