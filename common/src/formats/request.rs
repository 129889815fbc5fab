//! What a request body says, whatever its family calls it: the prompt ([`prompt_of`], the
//! one prompt walker, and the input tokens estimated from its characters), the output-token
//! limit and the field it came from, the model, and whether a streamed answer was asked for.
//!
//! The one owner of request-body knowledge: the replay's ISL estimate, the tokenizer's
//! prompt counts, the mock's answers, `recording stats` and `export` all read bodies through
//! these functions, so they agree.

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

/// The prompt of a request body as an OpenAI-compatible model server sees it: what the
/// tokenizer renders through the chat template and what `export` writes. Found by
/// [`prompt_of`], the one prompt walker.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Chat messages and tools (OpenAI chat shape), for the chat template.
    Chat(ChatPrompt),
    /// A completions-style prompt: one text per sequence the server tokenizes on its own
    /// (a `/v1/completions` batch, `prompt: ["a", "b"]`, is two).
    Text(Vec<String>),
}

/// Chat messages and the tools offered, in the OpenAI chat shape whatever the family.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatPrompt {
    pub messages: Vec<ChatMessage>,
    /// OpenAI-shaped tools (`{"type": "function", "function": {name, description,
    /// parameters}}`), converted from Anthropic's and Bedrock's own shapes; `None` when the
    /// request offers none.
    pub tools: Option<Value>,
}

/// One chat message as chat templates (and AIPerf's `messages`) take it. Serializes to the
/// OpenAI message shape, optional fields left out.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct ChatMessage {
    pub role: String,
    /// The text: a string, or the text parts of a content list concatenated (images and
    /// other non-text parts have none).
    pub content: String,
    /// OpenAI-shaped tool calls (`[{id, type: "function", function: {name, arguments}}]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    /// A tool result's call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    fn text(role: &str, content: String) -> ChatMessage {
        ChatMessage {
            role: role.to_owned(),
            content,
            ..ChatMessage::default()
        }
    }
}

/// The one prompt walker: the prompt of a request body of `family` (from its path), or
/// `None` when it holds none.
///
/// - Messages (OpenAI chat, Anthropic, Bedrock Converse, Ollama chat, gateways): a `system`
///   beside them (a string or text blocks) is a leading system message; each message keeps
///   its role, its text, and OpenAI `tool_calls`, `tool_call_id` and `name`. Anthropic and
///   Bedrock content blocks are converted as llama.cpp's server converts an Anthropic body
///   (`server_chat_convert_anthropic_to_oai`): text blocks are the content, `tool_use` /
///   `toolUse` blocks become the message's `tool_calls` (arguments: the input as compact
///   JSON), and each `tool_result` / `toolResult` block becomes a `tool` message of its
///   own after it (the message itself is left out when it holds nothing else).
/// - OpenAI Responses: `instructions` is a system message, `input` a user message or a
///   list of items (`function_call` an assistant message, `function_call_output` a tool
///   message).
/// - Completions (`prompt`, a string or a batch of strings), Ollama generate (`system` and
///   `prompt`), Bedrock invoke of older models (`inputText`): texts.
///
/// Tools: `tools` (Anthropic's `{name, description, input_schema}` converted) or Bedrock's
/// `toolConfig.tools` (`toolSpec`), as OpenAI tools.
pub fn prompt_of(family: Option<Family>, body: &Value) -> Option<Prompt> {
    let mut messages = Vec::new();
    if let Some(list) = body.get("messages").and_then(Value::as_array) {
        if let Some(system) = body.get("system") {
            let text = content_text(system);
            if !text.is_empty() {
                messages.push(ChatMessage::text("system", text));
            }
        }
        for message in list {
            push_message(message, &mut messages);
        }
    } else if family == Some(Family::OpenAiResponses)
        || body.get("input").is_some() && body.get("prompt").is_none()
    {
        responses_messages(body, &mut messages);
    } else {
        return completion_texts(body).map(Prompt::Text);
    }
    if messages.is_empty() {
        return None;
    }
    Some(Prompt::Chat(ChatPrompt {
        messages,
        tools: tools_of(body),
    }))
}

/// One message of a `messages` list, with the tool messages its content blocks hold.
fn push_message(message: &Value, out: &mut Vec<ChatMessage>) {
    let role = message
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("user");
    let string = |key: &str| message.get(key).and_then(Value::as_str).map(str::to_owned);
    let mut chat = ChatMessage {
        role: role.to_owned(),
        content: String::new(),
        tool_calls: message.get("tool_calls").filter(|v| v.is_array()).cloned(),
        tool_call_id: string("tool_call_id"),
        name: string("name"),
    };
    let Some(Value::Array(blocks)) = message.get("content") else {
        chat.content = message.get("content").map(content_text).unwrap_or_default();
        out.push(chat);
        return;
    };
    let mut calls = Vec::new();
    let mut results = Vec::new();
    let mut has_text = false;
    for block in blocks {
        let kind = block.get("type").and_then(Value::as_str);
        if kind == Some("tool_use") {
            calls.push(tool_call(
                block.get("id"),
                block.get("name"),
                block.get("input"),
            ));
        } else if let Some(using) = block.get("toolUse") {
            calls.push(tool_call(
                using.get("toolUseId"),
                using.get("name"),
                using.get("input"),
            ));
        } else if kind == Some("tool_result") {
            results.push(tool_result(block.get("tool_use_id"), block.get("content")));
        } else if let Some(result) = block.get("toolResult") {
            results.push(tool_result(result.get("toolUseId"), result.get("content")));
        } else if let Some(text) = block.get("text").and_then(Value::as_str) {
            chat.content.push_str(text);
            has_text = true;
        }
    }
    if !calls.is_empty() {
        chat.tool_calls = Some(Value::Array(calls));
    }
    // A message of tool results only is its tool messages alone, as the server sees it.
    if has_text || chat.tool_calls.is_some() || results.is_empty() {
        out.push(chat);
    }
    out.extend(results);
}

/// An OpenAI tool call from an Anthropic `tool_use` or Bedrock `toolUse` block.
fn tool_call(id: Option<&Value>, name: Option<&Value>, input: Option<&Value>) -> Value {
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
    let arguments = match input {
        Some(Value::String(s)) => s.clone(),
        Some(input) => input.to_string(),
        None => "{}".to_owned(),
    };
    serde_json::json!({
        "id": text(id),
        "type": "function",
        "function": {"name": text(name), "arguments": arguments},
    })
}

/// A `tool` message from an Anthropic `tool_result` or Bedrock `toolResult` block.
fn tool_result(id: Option<&Value>, content: Option<&Value>) -> ChatMessage {
    ChatMessage {
        role: "tool".to_owned(),
        content: content.map(content_text).unwrap_or_default(),
        tool_call_id: Some(id.and_then(Value::as_str).unwrap_or_default().to_owned()),
        ..ChatMessage::default()
    }
}

/// OpenAI Responses: `instructions`, then `input` (a string or items).
fn responses_messages(body: &Value, out: &mut Vec<ChatMessage>) {
    if let Some(instructions) = body.get("instructions").and_then(Value::as_str) {
        out.push(ChatMessage::text("system", instructions.to_owned()));
    }
    match body.get("input") {
        Some(Value::String(text)) => out.push(ChatMessage::text("user", text.clone())),
        Some(Value::Array(items)) => {
            for item in items {
                let role = match item.get("type").and_then(Value::as_str) {
                    Some("function_call") => "assistant",
                    Some("function_call_output") => "tool",
                    _ => item.get("role").and_then(Value::as_str).unwrap_or("user"),
                };
                let content = match item.get("content") {
                    Some(content) => content_text(content),
                    None => content_text(item),
                };
                out.push(ChatMessage::text(role, content));
            }
        }
        _ => {}
    }
}

/// Completions (`prompt`: a string or a batch of strings), Ollama generate (`system` before
/// its `prompt`), Bedrock invoke of older models (`inputText`).
fn completion_texts(body: &Value) -> Option<Vec<String>> {
    let prompt = body.get("prompt").or_else(|| body.get("inputText"))?;
    let texts: Vec<String> = match prompt {
        Value::String(text) => {
            let mut out = String::new();
            if let Some(system) = body.get("system").and_then(Value::as_str) {
                out.push_str(system);
                out.push('\n');
            }
            out.push_str(text);
            vec![out]
        }
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => return None,
    };
    (texts.iter().any(|t| !t.is_empty())).then_some(texts)
}

/// The tools a request offers, as OpenAI tools.
fn tools_of(body: &Value) -> Option<Value> {
    let list = body
        .get("tools")
        .or_else(|| body.pointer("/toolConfig/tools"))?
        .as_array()
        .filter(|list| !list.is_empty())?;
    let tools = list
        .iter()
        .map(|tool| {
            let spec = tool.get("toolSpec");
            let schema = tool
                .get("input_schema")
                .or_else(|| spec.and_then(|s| s.pointer("/inputSchema/json")));
            match (spec, schema) {
                (None, None) => tool.clone(),
                _ => {
                    let from = spec.unwrap_or(tool);
                    serde_json::json!({"type": "function", "function": {
                        "name": from.get("name").and_then(Value::as_str).unwrap_or_default(),
                        "description": from.get("description").and_then(Value::as_str).unwrap_or_default(),
                        "parameters": schema.cloned().unwrap_or_else(|| serde_json::json!({})),
                    }})
                }
            }
        })
        .collect();
    Some(Value::Array(tools))
}

/// The text of a content value: a string, or the text parts of a list of blocks
/// concatenated (a nested `content`, as of a tool result, by its text; Responses
/// `function_call` by its arguments and `function_call_output` by its output; Bedrock JSON
/// content by its JSON; images and other parts have none).
fn content_text(value: &Value) -> String {
    let mut out = String::new();
    push_content_text(value, &mut out, 0);
    out
}

fn push_content_text(value: &Value, out: &mut String, depth: usize) {
    if depth > 16 {
        return;
    }
    match value {
        Value::String(s) => out.push_str(s),
        Value::Array(items) => {
            for item in items {
                push_content_text(item, out, depth + 1);
            }
        }
        Value::Object(block) => {
            if let Some(text) = block.get("text").and_then(Value::as_str) {
                out.push_str(text);
            } else if let Some(content) = block.get("content") {
                push_content_text(content, out, depth + 1);
            } else if let Some(arguments) = block.get("arguments").and_then(Value::as_str) {
                out.push_str(arguments);
            } else if let Some(output) = block.get("output") {
                push_content_text(output, out, depth + 1);
            } else if let Some(json) = block.get("json") {
                out.push_str(&json.to_string());
            }
        }
        _ => {}
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
    fn chat(family: Option<Family>, body: Value) -> ChatPrompt {
        match prompt_of(family, &body) {
            Some(Prompt::Chat(chat)) => chat,
            other => panic!("a chat prompt for {body}, got {other:?}"),
        }
    }

    fn roles_and_texts(chat: &ChatPrompt) -> Vec<(&str, &str)> {
        chat.messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect()
    }

    #[test]
    fn the_prompt_walker_covers_every_family() {
        // OpenAI chat: text parts concatenated, tool calls and results kept.
        let openai = chat(
            Some(Family::OpenAiChat),
            json!({"messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": [{"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": "data:"}}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "r"}],
                "tools": [{"type": "function", "function": {"name": "f"}}]}),
        );
        assert_eq!(
            roles_and_texts(&openai),
            [
                ("system", "S"),
                ("user", "ab"),
                ("assistant", ""),
                ("tool", "r")
            ]
        );
        assert!(openai.messages[2].tool_calls.is_some());
        assert_eq!(openai.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(openai.messages[3].name.as_deref(), Some("f"));
        assert_eq!(
            openai.tools,
            Some(json!([{"type": "function", "function": {"name": "f"}}]))
        );

        // Anthropic: system blocks, tool_use → tool_calls, tool_result → a tool message.
        let anthropic = chat(
            Some(Family::Anthropic),
            json!({"system": [{"type": "text", "text": "S"}],
                "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
                "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "text", "text": "t"},
                    {"type": "tool_use", "id": "u1", "name": "f", "input": {"x": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1",
                    "content": [{"type": "text", "text": "r"}]}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u2", "content": "s"},
                    {"type": "text", "text": "next"}]}]}),
        );
        assert_eq!(
            roles_and_texts(&anthropic),
            [
                ("system", "S"),
                ("user", "q"),
                ("assistant", "t"),
                ("tool", "r"),
                ("user", "next"),
                ("tool", "s")
            ]
        );
        assert_eq!(
            anthropic.messages[2].tool_calls,
            Some(json!([{"id": "u1", "type": "function",
                "function": {"name": "f", "arguments": "{\"x\":1}"}}]))
        );
        assert_eq!(anthropic.messages[3].tool_call_id.as_deref(), Some("u1"));
        assert_eq!(
            anthropic.tools,
            Some(
                json!([{"type": "function", "function": {"name": "f", "description": "d",
                "parameters": {"type": "object"}}}])
            )
        );

        // Bedrock Converse: toolUse / toolResult blocks and toolConfig.tools.
        let bedrock = chat(
            Some(Family::BedrockConverse),
            json!({"system": [{"text": "S"}],
                "toolConfig": {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {"type": "object"}}}}]},
                "messages": [
                {"role": "assistant", "content": [{"toolUse": {"toolUseId": "b1", "name": "f", "input": {}}}]},
                {"role": "user", "content": [{"toolResult": {"toolUseId": "b1", "content": [{"json": {"ok": true}}]}}]}]}),
        );
        assert_eq!(
            roles_and_texts(&bedrock),
            [
                ("system", "S"),
                ("assistant", ""),
                ("tool", "{\"ok\":true}")
            ]
        );
        assert_eq!(
            bedrock.messages[1]
                .tool_calls
                .as_ref()
                .map(|c| c[0]["function"]["name"].clone()),
            Some(json!("f"))
        );
        assert_eq!(
            bedrock.tools,
            Some(
                json!([{"type": "function", "function": {"name": "f", "description": "",
                "parameters": {"type": "object"}}}])
            )
        );

        // Responses: instructions, input items.
        let responses = chat(
            Some(Family::OpenAiResponses),
            json!({"instructions": "I", "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "q"}]},
                {"type": "function_call", "name": "f", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "c", "output": "o"}]}),
        );
        assert_eq!(
            roles_and_texts(&responses),
            [
                ("system", "I"),
                ("user", "q"),
                ("assistant", "{\"a\":1}"),
                ("tool", "o")
            ]
        );
        let plain = chat(
            Some(Family::OpenAiResponses),
            json!({"instructions": "I", "input": "q"}),
        );
        assert_eq!(roles_and_texts(&plain), [("system", "I"), ("user", "q")]);

        // Ollama chat (tool calls with object arguments kept) and generate.
        let ollama = chat(
            Some(Family::Ollama),
            json!({"messages": [{"role": "assistant", "content": "",
                "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}]}),
        );
        assert_eq!(roles_and_texts(&ollama), [("assistant", "")]);
        assert!(ollama.messages[0].tool_calls.is_some());
        assert_eq!(
            prompt_of(Some(Family::Ollama), &json!({"system": "S", "prompt": "p"})),
            Some(Prompt::Text(vec!["S\np".to_owned()]))
        );

        // Completions: a string, a batch; Bedrock invoke's inputText.
        assert_eq!(
            prompt_of(Some(Family::OpenAiCompletions), &json!({"prompt": "p"})),
            Some(Prompt::Text(vec!["p".to_owned()]))
        );
        assert_eq!(
            prompt_of(
                Some(Family::OpenAiCompletions),
                &json!({"prompt": ["a", "b"]})
            ),
            Some(Prompt::Text(vec!["a".to_owned(), "b".to_owned()]))
        );
        assert_eq!(
            prompt_of(Some(Family::BedrockInvoke), &json!({"inputText": "i"})),
            Some(Prompt::Text(vec!["i".to_owned()]))
        );
        // No prompt.
        assert_eq!(prompt_of(Some(Family::OpenAiChat), &json!({})), None);
        assert_eq!(
            prompt_of(Some(Family::OpenAiChat), &json!({"messages": []})),
            None
        );
    }

    #[test]
    fn a_chat_message_serializes_to_the_openai_shape() {
        let message = ChatMessage {
            role: "tool".to_owned(),
            content: "r".to_owned(),
            tool_call_id: Some("c".to_owned()),
            ..ChatMessage::default()
        };
        assert_eq!(
            serde_json::to_value(&message).expect("serializes"),
            json!({"role": "tool", "content": "r", "tool_call_id": "c"})
        );
    }
}
