//! What a request body says, whatever its family calls it: the prompt text (and the input
//! tokens estimated from it), the output-token limit and the field it came from, the model,
//! and whether a streamed answer was asked for.
//!
//! The one owner of request-body knowledge: the replay's ISL estimate, the mock's answers,
//! `recording stats` and `export` all read bodies through these functions, so they agree.

use serde_json::Value;

use super::Family;

/// The fields that carry an output-token limit, as JSON pointers, in the order they are
/// looked up: OpenAI and Anthropic `max_tokens`, OpenAI `max_completion_tokens`, Responses
/// `max_output_tokens`, TGI `max_new_tokens`, Ollama `options.num_predict`, Bedrock Converse
/// `inferenceConfig.maxTokens`.
pub const MAX_TOKENS_FIELDS: &[&str] = &[
    "/max_tokens",
    "/max_completion_tokens",
    "/max_output_tokens",
    "/max_new_tokens",
    "/options/num_predict",
    "/inferenceConfig/maxTokens",
];

/// Keys whose string values (directly or inside arrays) are prompt text.
const TEXT_KEYS: &[&str] = &[
    "content",
    "text",
    "prompt",
    "input",
    "system",
    "instructions",
];

/// An output-token limit and the field (a JSON pointer of [`MAX_TOKENS_FIELDS`]) it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxTokens {
    pub value: u64,
    pub field: &'static str,
}

/// The request's output-token limit: the first field of [`MAX_TOKENS_FIELDS`] that holds a
/// non-negative integer (Ollama's `num_predict: -1`, "no limit", is none).
pub fn max_tokens(body: &Value) -> Option<MaxTokens> {
    MAX_TOKENS_FIELDS.iter().find_map(|field| {
        let value = body.pointer(field)?.as_u64()?;
        Some(MaxTokens { value, field })
    })
}

/// The request's `model`, when it names one in the body (Bedrock names it in the path).
pub fn model(body: &Value) -> Option<&str> {
    body.get("model").and_then(Value::as_str)
}

/// The model a Bedrock path names (`/model/{id}/converse-stream`), percent-decoded
/// (`anthropic.claude-v2%3A1` → `anthropic.claude-v2:1`); the id is everything between
/// `/model/` and the operation, the last segment.
pub fn path_model(path: &str) -> Option<String> {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let rest = &path[path.find("/model/")? + "/model/".len()..];
    let (id, _operation) = rest.rsplit_once('/')?;
    (!id.is_empty()).then(|| percent_decode(id))
}

/// The model of a request: the body's `model`, else the one its Bedrock path names.
pub fn model_of(path: &str, body: Option<&Value>) -> Option<String> {
    body.and_then(model)
        .map(str::to_owned)
        .or_else(|| path_model(path))
}

/// Percent-decode a URL path segment (Bedrock model ids arrive with `:` as `%3A`); a `%`
/// not followed by two hex digits stays as it is.
pub fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex_val(bytes[i + 1]), hex_val(bytes[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The request's `stream` field: `Some` of a boolean, `None` when absent or null; an error
/// message when it holds anything else.
pub fn stream_flag(body: &Value) -> Result<Option<bool>, String> {
    match body.get("stream") {
        Some(Value::Bool(stream)) => Ok(Some(*stream)),
        Some(Value::Null) | None => Ok(None),
        Some(other) => Err(format!("\"stream\" must be a boolean, got {other}")),
    }
}

/// The `stream` field of a raw body, `None` when the body is not JSON or the field is not a
/// boolean (reads only that field).
pub fn stream_flag_of(body: &[u8]) -> Option<bool> {
    #[derive(serde::Deserialize)]
    struct StreamFlag {
        stream: Option<bool>,
    }
    serde_json::from_slice::<StreamFlag>(body)
        .ok()
        .and_then(|flag| flag.stream)
}

/// Whether a request on `path` of `family` with this `stream` flag asks for a streamed
/// answer: Bedrock's streaming operations always do; otherwise the flag decides, and without
/// one Ollama's native API streams and the others do not.
pub fn asks_stream(family: Option<Family>, path: &str, flag: Option<bool>) -> bool {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    if path.ends_with("/converse-stream") || path.ends_with("/invoke-with-response-stream") {
        return true;
    }
    flag.unwrap_or(family == Some(Family::Ollama))
}

/// `--request-usage`: make an OpenAI-compatible chat or completions request that streams
/// and does not ask for usage ask for it (`stream_options.include_usage: true`, other
/// `stream_options` kept), so the server's own counts come in the stream's last chunk; it
/// changes nothing of what the server generates. Returns true when `body` (the request's
/// top-level JSON object, sent to `path`) was changed; every other request (another
/// family, not streamed, already asking, or declining with `include_usage: false` — a
/// recorded choice) is left as it is.
pub fn ask_usage(path: &str, body: &mut serde_json::Map<String, Value>) -> bool {
    if !matches!(
        super::family_for_path(path),
        Some(Family::OpenAiChat | Family::OpenAiCompletions)
    ) || body.get("stream") != Some(&Value::Bool(true))
    {
        return false;
    }
    let options = body
        .entry("stream_options")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if options.is_null() {
        *options = Value::Object(serde_json::Map::new());
    }
    match options {
        Value::Object(options) if !options.contains_key("include_usage") => {
            options.insert("include_usage".to_owned(), Value::Bool(true));
            true
        }
        _ => false,
    }
}

/// Characters of prompt text in a request body: strings under a text key (`content`,
/// `text`, `prompt`, `input`, `system`, `instructions`), also inside arrays, and the text keys
/// of nested blocks (chat messages, Anthropic and Bedrock content blocks, Responses input
/// items, Gemini parts). Recursion depth is bounded by serde_json's own nesting limit.
pub fn prompt_chars(body: &Value) -> u64 {
    text_chars(body, false)
}

/// Input tokens estimated from the prompt text: characters divided by four (the usual
/// English-text ratio), rounded up.
pub fn estimated_input_tokens(body: &Value) -> u64 {
    prompt_chars(body).div_ceil(4)
}

fn text_chars(value: &Value, under_text_key: bool) -> u64 {
    match value {
        Value::String(s) if under_text_key => s.chars().count() as u64,
        Value::Array(items) => items.iter().map(|v| text_chars(v, under_text_key)).sum(),
        Value::Object(obj) => obj
            .iter()
            .map(|(k, v)| text_chars(v, TEXT_KEYS.contains(&k.as_str())))
            .sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_asked_of_openai_streams_only_when_they_did_not_ask() {
        let ask = |path: &str, body: Value| {
            let Value::Object(mut map) = body else {
                panic!("an object")
            };
            let changed = ask_usage(path, &mut map);
            (changed, Value::Object(map))
        };
        let (changed, body) = ask(
            "/v1/chat/completions",
            serde_json::json!({"stream": true, "stream_options": {"continuous_usage_stats": false}}),
        );
        assert!(changed);
        assert_eq!(
            body["stream_options"],
            serde_json::json!({"continuous_usage_stats": false, "include_usage": true})
        );
        assert!(ask("/v1/completions", serde_json::json!({"stream": true})).0);
        // Not streamed (vLLM refuses stream_options then), declined on purpose, other families.
        assert!(!ask("/v1/chat/completions", serde_json::json!({"stream": false})).0);
        assert!(!ask("/v1/chat/completions", serde_json::json!({})).0);
        assert!(
            !ask(
                "/v1/chat/completions",
                serde_json::json!({"stream": true, "stream_options": {"include_usage": false}})
            )
            .0
        );
        assert!(!ask("/v1/messages", serde_json::json!({"stream": true})).0);
        assert!(!ask("/v1/responses", serde_json::json!({"stream": true})).0);
    }
    use serde_json::json;

    #[test]
    fn max_tokens_reads_every_family_and_names_the_field() {
        let cases = [
            (json!({"max_tokens": 3}), Some((3, "/max_tokens"))),
            (
                json!({"max_completion_tokens": 7}),
                Some((7, "/max_completion_tokens")),
            ),
            (
                json!({"max_output_tokens": 8}),
                Some((8, "/max_output_tokens")),
            ),
            (json!({"max_new_tokens": 9}), Some((9, "/max_new_tokens"))),
            (
                json!({"options": {"num_predict": 4}}),
                Some((4, "/options/num_predict")),
            ),
            (json!({"options": {"num_predict": -1}}), None),
            (
                json!({"inferenceConfig": {"maxTokens": 5}}),
                Some((5, "/inferenceConfig/maxTokens")),
            ),
            (
                json!({"max_tokens": "many", "max_completion_tokens": 2}),
                Some((2, "/max_completion_tokens")),
            ),
            (json!({}), None),
        ];
        for (body, want) in cases {
            let got = max_tokens(&body).map(|m| (m.value, m.field));
            assert_eq!(got, want, "{body}");
        }
    }

    #[test]
    fn bedrock_model_ids_are_decoded() {
        assert_eq!(
            path_model("/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse-stream")
                .as_deref(),
            Some("anthropic.claude-3-5-sonnet-20240620-v1:0")
        );
        assert_eq!(percent_decode("a%2Fb%zz%4"), "a/b%zz%4");
        assert_eq!(path_model("/v1/chat/completions"), None);
        let body = json!({"model": "m"});
        assert_eq!(
            model_of("/model/x/invoke", Some(&body)).as_deref(),
            Some("m")
        );
        assert_eq!(model_of("/model/x/invoke", None).as_deref(), Some("x"));
    }

    #[test]
    fn stream_flag_model_and_prompt_text() {
        assert_eq!(stream_flag(&json!({"stream": true})), Ok(Some(true)));
        assert_eq!(stream_flag(&json!({"stream": null})), Ok(None));
        assert!(stream_flag(&json!({"stream": "yes"})).is_err());
        assert_eq!(stream_flag_of(br#"{"stream":false,"x":[1]}"#), Some(false));
        assert_eq!(stream_flag_of(b"not json"), None);
        assert!(asks_stream(None, "/model/m/converse-stream?x", Some(false)));
        assert!(asks_stream(Some(Family::Ollama), "/api/chat", None));
        assert!(!asks_stream(
            Some(Family::OpenAiChat),
            "/v1/chat/completions",
            None
        ));
        assert_eq!(model(&json!({"model": "m"})), Some("m"));
        assert_eq!(model(&json!({"model": 1})), None);
        let bedrock = json!({"system": [{"text": "1234"}],
            "messages": [{"role": "user", "content": [{"text": "12345"}]}]});
        assert_eq!(prompt_chars(&bedrock), 9);
        assert_eq!(estimated_input_tokens(&bedrock), 3);
        let gemini = json!({"contents": [{"parts": [{"text": "abcd"}]}]});
        assert_eq!(prompt_chars(&gemini), 4);
        let chat =
            json!({"model": "not prompt", "messages": [{"role": "user", "content": "héllo"}]});
        assert_eq!(prompt_chars(&chat), 5);
    }
}
