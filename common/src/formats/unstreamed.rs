//! Reading non-streamed (`stream:false`) JSON response bodies of each family.
//!
//! One body per request, not per frame, so this parses into a `serde_json::Value` and allocates
//! freely: clarity over speed here.

use serde_json::Value;

use super::json::describe_error;
use super::{Family, FrameError, Usage};

/// What a non-streamed JSON response body says. Callers count a 2xx body with content as one
/// content frame.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Unstreamed {
    /// The body carries generated output: text, reasoning or tool calls.
    pub has_content: bool,
    /// The body's usage report, when it has one.
    pub usage: Option<Usage>,
    /// The body is an error object; its message.
    pub error: Option<String>,
}

/// Read a non-streamed response body of `family`.
///
/// Fails only when the body is not JSON; a JSON body of an unexpected shape is simply one with
/// no content and no usage.
pub fn unstreamed(family: Family, body: &[u8]) -> Result<Unstreamed, FrameError> {
    let value: Value = serde_json::from_slice(body).map_err(|error| FrameError::Malformed {
        family: family.name(),
        reason: format!("non-streamed body is not JSON: {error}"),
    })?;
    Ok(match family {
        Family::OpenAiChat | Family::OpenAiCompletions => openai_chat(&value),
        Family::OpenAiResponses => openai_responses(&value),
        Family::Anthropic | Family::BedrockInvoke => anthropic(&value),
        Family::Ollama => ollama(&value),
        Family::BedrockConverse => bedrock_converse(&value),
    })
}

fn openai_chat(body: &Value) -> Unstreamed {
    let error = truthy(&body["error"])
        .then(|| describe_error(&body["error"]))
        .or_else(|| (body["object"] == "error").then(|| describe_error(body)));
    let has_content = array(&body["choices"]).iter().any(|choice| {
        let message = &choice["message"];
        non_empty_str(&choice["text"])
            || non_empty_str(&message["content"])
            || non_empty_array(&message["content"])
            || non_empty_str(&message["refusal"])
            || non_empty_str(&message["reasoning"])
            || non_empty_str(&message["reasoning_content"])
            || non_empty_array(&message["tool_calls"])
            || message["function_call"].is_object()
    });
    let usage = body["usage"].is_object().then(|| Usage {
        input_tokens: body["usage"]["prompt_tokens"].as_u64(),
        output_tokens: body["usage"]["completion_tokens"].as_u64(),
        cached_input_tokens: body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
    });
    Unstreamed {
        has_content,
        usage,
        error,
    }
}

fn openai_responses(body: &Value) -> Unstreamed {
    let error = if truthy(&body["error"]) {
        Some(describe_error(&body["error"]))
    } else if body["status"] == "failed" {
        Some("response failed".to_owned())
    } else {
        None
    };
    let has_content = array(&body["output"])
        .iter()
        .any(|item| match item["type"].as_str() {
            Some("message") => array(&item["content"])
                .iter()
                .any(|part| non_empty_str(&part["text"]) || non_empty_str(&part["refusal"])),
            Some("reasoning") => array(&item["summary"])
                .iter()
                .chain(array(&item["content"]))
                .any(|part| non_empty_str(&part["text"])),
            // function_call, custom_tool_call, web_search_call, …: generated tool use.
            Some(_) => true,
            None => false,
        });
    let usage = body["usage"].is_object().then(|| Usage {
        input_tokens: body["usage"]["input_tokens"].as_u64(),
        output_tokens: body["usage"]["output_tokens"].as_u64(),
        cached_input_tokens: body["usage"]["input_tokens_details"]["cached_tokens"].as_u64(),
    });
    Unstreamed {
        has_content,
        usage,
        error,
    }
}

fn anthropic(body: &Value) -> Unstreamed {
    let error = (body["type"] == "error").then(|| describe_error(&body["error"]));
    let has_content = array(&body["content"])
        .iter()
        .any(|block| match block["type"].as_str() {
            Some("text") => non_empty_str(&block["text"]),
            Some("thinking") => non_empty_str(&block["thinking"]),
            Some("tool_use" | "server_tool_use" | "redacted_thinking") => true,
            _ => false,
        });
    let usage = body["usage"].is_object().then(|| {
        let usage = &body["usage"];
        let input = usage["input_tokens"].as_u64().map(|n| {
            n + usage["cache_creation_input_tokens"].as_u64().unwrap_or(0)
                + usage["cache_read_input_tokens"].as_u64().unwrap_or(0)
        });
        Usage {
            input_tokens: input,
            output_tokens: usage["output_tokens"].as_u64(),
            cached_input_tokens: input
                .map(|_| usage["cache_read_input_tokens"].as_u64().unwrap_or(0)),
        }
    });
    Unstreamed {
        has_content,
        usage,
        error,
    }
}

fn ollama(body: &Value) -> Unstreamed {
    let error = truthy(&body["error"]).then(|| describe_error(&body["error"]));
    let message = &body["message"];
    let has_content = non_empty_str(&message["content"])
        || non_empty_str(&message["thinking"])
        || non_empty_array(&message["tool_calls"])
        || non_empty_str(&body["response"])
        || non_empty_str(&body["thinking"])
        || non_empty_array(&body["tool_calls"]);
    // Counts are `omitempty`: on a finished reply an absent count is zero.
    let usage = (body["done"] == true || body["eval_count"].is_u64()).then(|| Usage {
        input_tokens: Some(body["prompt_eval_count"].as_u64().unwrap_or(0)),
        output_tokens: Some(body["eval_count"].as_u64().unwrap_or(0)),
        cached_input_tokens: None,
    });
    Unstreamed {
        has_content,
        usage,
        error,
    }
}

fn bedrock_converse(body: &Value) -> Unstreamed {
    // Bedrock's error bodies are `{"message":"…"}` (type in a header), with no `output`.
    let error =
        (body["output"].is_null() && body["message"].is_string()).then(|| describe_error(body));
    let has_content = array(&body["output"]["message"]["content"])
        .iter()
        .any(|block| {
            non_empty_str(&block["text"])
                || block["toolUse"].is_object()
                || non_empty_str(&block["reasoningContent"]["reasoningText"]["text"])
        });
    let usage = body["usage"].is_object().then(|| {
        let usage = &body["usage"];
        Usage {
            input_tokens: usage["inputTokens"].as_u64().map(|n| {
                n + usage["cacheReadInputTokens"].as_u64().unwrap_or(0)
                    + usage["cacheWriteInputTokens"].as_u64().unwrap_or(0)
            }),
            output_tokens: usage["outputTokens"].as_u64(),
            cached_input_tokens: usage["cacheReadInputTokens"].as_u64(),
        }
    });
    Unstreamed {
        has_content,
        usage,
        error,
    }
}

fn array(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

fn non_empty_str(value: &Value) -> bool {
    value.as_str().is_some_and(|s| !s.is_empty())
}

fn non_empty_array(value: &Value) -> bool {
    value.as_array().is_some_and(|a| !a.is_empty())
}

/// Python truthiness, as the openai SDK tests `error`.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}
