//! OpenAI-compatible stream semantics: Chat Completions and legacy Completions chunks
//! (wire reference §2.2–§2.8) and the Responses API's named events (§2.9).
//!
//! Chunks are deserialized into borrowed structs; `choices` and `tool_calls` are folded by
//! hand-written sequence visitors instead of being collected into `Vec`s, so a chunk costs no
//! allocation unless its text has JSON escapes.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::json::{Count, Text, drain_map, parse, trim, truthy_error_message};
use super::sse::SseEvent;
use super::{ContentKind, Event, FrameError, Usage};

/// Semantics of `/v1/chat/completions` and `/v1/completions` streams (one parser serves both:
/// chat chunks carry `delta`, completion chunks carry `text`).
#[derive(Debug)]
pub(crate) struct ChatSemantics {
    family: &'static str,
}

impl ChatSemantics {
    pub(crate) fn new(family: &'static str) -> Self {
        ChatSemantics { family }
    }

    /// Interpret one SSE event.
    pub(crate) fn on_sse(
        &mut self,
        sse: SseEvent<'_>,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FrameError> {
        let data = trim(sse.data);
        if data.is_empty() {
            return Ok(());
        }
        if data == b"[DONE]" {
            on_event(Event::Terminal);
            return Ok(());
        }
        let mut chunk: Chunk<'_> = parse(self.family, data)?;

        if let Some((kind, text)) = chunk.choices.content.take() {
            on_event(Event::Content { kind, text });
        }
        if let Some(usage) = chunk.usage {
            // Ollama's compat layer puts zero-filled usage on every intermediate chunk: a zero
            // is only believed on the final usage chunk (the one without choices).
            let final_chunk = chunk.choices.count == 0;
            let believe = |count: Count| count.0.filter(|n| *n > 0 || final_chunk);
            let usage = Usage {
                input_tokens: believe(usage.prompt_tokens),
                output_tokens: believe(usage.completion_tokens),
                cached_input_tokens: usage.prompt_tokens_details.and_then(|d| d.cached_tokens.0),
            };
            if usage.input_tokens.is_some() || usage.output_tokens.is_some() {
                on_event(Event::Usage(usage));
            }
        }
        if let Some(timings) = chunk.timings {
            super::emit_server_count(timings.stated_count(), on_event);
        }
        if let Some(message) = chunk_error(&chunk, sse.event) {
            on_event(Event::Error { message });
        }
        Ok(())
    }
}

/// llama.cpp's `timings` object (`result_timings::to_json` in its `tools/server`): the
/// tokens it generated (`predicted_n`), the prompt tokens it evaluated (`prompt_n`) and
/// those it took from its prompt cache (`cache_n`); the rest (milliseconds, rates) is not
/// needed here.
#[derive(Deserialize, Clone, Copy)]
struct LlamaTimings {
    #[serde(default)]
    prompt_n: Count,
    #[serde(default)]
    cache_n: Count,
    #[serde(default)]
    predicted_n: Count,
}

impl LlamaTimings {
    /// The counts as usage would say them: input = evaluated + cached (llama.cpp's own
    /// `prompt_tokens` is the same sum).
    fn stated_count(self) -> Usage {
        Usage {
            input_tokens: self
                .prompt_n
                .0
                .map(|evaluated| evaluated + self.cache_n.0.unwrap_or(0)),
            output_tokens: self.predicted_n.0,
            cached_input_tokens: self.cache_n.0,
        }
    }
}

/// The error a chunk reports, if any: a truthy top-level `error`, older vLLM's
/// `"object":"error"`, OpenRouter's `finish_reason:"error"`, or an `event: error` line.
fn chunk_error(chunk: &Chunk<'_>, event_name: Option<&str>) -> Option<Cow<'static, str>> {
    if let Some(message) = chunk.error.and_then(truthy_error_message) {
        return Some(message);
    }
    if chunk.object.as_str() == "error" {
        let message = chunk.message.as_str();
        return Some(Cow::Owned(if message.is_empty() {
            "error object".to_owned()
        } else {
            message.to_owned()
        }));
    }
    if chunk.choices.finish_error {
        return Some(Cow::Borrowed("finish_reason: error"));
    }
    if event_name == Some("error") {
        return Some(Cow::Borrowed("error event"));
    }
    None
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Choices<'a>,
    /// `null` (OpenAI with `include_usage`) and absent (vLLM) both give `None`.
    #[serde(default)]
    usage: Option<ChunkUsage>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
    #[serde(default, borrow)]
    object: Text<'a>,
    #[serde(default, borrow)]
    message: Text<'a>,
    /// llama.cpp's server counts, on its last chunk (see [`LlamaTimings`]).
    #[serde(default)]
    timings: Option<LlamaTimings>,
}

#[derive(Deserialize, Clone, Copy)]
struct ChunkUsage {
    #[serde(default)]
    prompt_tokens: Count,
    #[serde(default)]
    completion_tokens: Count,
    #[serde(default)]
    prompt_tokens_details: Option<CachedTokens>,
}

/// `prompt_tokens_details` (chat) or `input_tokens_details` (Responses): the cached part.
#[derive(Deserialize, Clone, Copy)]
struct CachedTokens {
    #[serde(default)]
    cached_tokens: Count,
}

/// `choices` folded to what measuring needs: the first choice's generated content, the number
/// of choices, and whether any choice finished with `error`. `[]`, `null` or absent are all
/// zero choices.
#[derive(Default)]
struct Choices<'a> {
    count: usize,
    content: Option<(ContentKind, Cow<'a, str>)>,
    finish_error: bool,
}

impl<'de: 'a, 'a> Deserialize<'de> for Choices<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ChoicesVisitor<'a>(PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for ChoicesVisitor<'a> {
            type Value = Choices<'a>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Choices::default())
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(Choices::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                Choices::deserialize(d)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                drain_map(map)?;
                Ok(Choices::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut choices = Choices::default();
                while let Some(choice) = seq.next_element::<Choice<'a>>()? {
                    choices.count += 1;
                    choices.finish_error |= choice.finish_reason.as_str() == "error";
                    if choices.content.is_none() {
                        choices.content = choice.content();
                    }
                }
                Ok(choices)
            }
        }

        deserializer.deserialize_any(ChoicesVisitor(PhantomData))
    }
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    /// Legacy completions carry the text here.
    #[serde(default, borrow)]
    text: Text<'a>,
    #[serde(default, borrow)]
    finish_reason: Text<'a>,
}

impl<'a> Choice<'a> {
    /// The one content this choice carries, visible text first.
    fn content(self) -> Option<(ContentKind, Cow<'a, str>)> {
        if let Some(text) = self.text.non_empty() {
            return Some((ContentKind::Text, text));
        }
        let delta = self.delta?;
        if let Some(text) = delta.content.non_empty() {
            return Some((ContentKind::Text, text));
        }
        if let Some(text) = delta.refusal.non_empty() {
            return Some((ContentKind::Text, text));
        }
        // vLLM ≥ 0.11 and Ollama say `reasoning`; DeepSeek, NIM and older vLLM
        // `reasoning_content`.
        if let Some(text) = delta.reasoning.non_empty() {
            return Some((ContentKind::Reasoning, text));
        }
        if let Some(text) = delta.reasoning_content.non_empty() {
            return Some((ContentKind::Reasoning, text));
        }
        if let Some(text) = delta.tool_calls.0 {
            return Some((ContentKind::ToolCall, text));
        }
        delta
            .function_call
            .and_then(FunctionDelta::content)
            .map(|text| (ContentKind::ToolCall, text))
    }
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Text<'a>,
    #[serde(default, borrow)]
    refusal: Text<'a>,
    #[serde(default, borrow)]
    reasoning: Text<'a>,
    #[serde(default, borrow)]
    reasoning_content: Text<'a>,
    #[serde(default, borrow)]
    tool_calls: ToolCalls<'a>,
    /// The deprecated single-function form.
    #[serde(default, borrow)]
    function_call: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize)]
struct ToolCallDelta<'a> {
    #[serde(default, borrow)]
    function: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize)]
struct FunctionDelta<'a> {
    #[serde(default, borrow)]
    name: Text<'a>,
    #[serde(default, borrow)]
    arguments: Text<'a>,
}

impl<'a> FunctionDelta<'a> {
    /// The argument fragment, or the name on a call's first fragment (arguments `""`).
    fn content(self) -> Option<Cow<'a, str>> {
        self.arguments.non_empty().or_else(|| self.name.non_empty())
    }
}

/// `tool_calls` folded to the first call fragment that carries an argument fragment or a name.
#[derive(Default)]
struct ToolCalls<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for ToolCalls<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ToolCallsVisitor<'a>(PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for ToolCallsVisitor<'a> {
            type Value = ToolCalls<'a>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of tool-call deltas")
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(ToolCalls(None))
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(ToolCalls(None))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                ToolCalls::deserialize(d)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                drain_map(map)?;
                Ok(ToolCalls(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut first = None;
                while first.is_none() {
                    match seq.next_element::<ToolCallDelta<'a>>()? {
                        Some(call) => first = call.function.and_then(FunctionDelta::content),
                        None => return Ok(ToolCalls(None)),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ToolCalls(first))
            }
        }

        deserializer.deserialize_any(ToolCallsVisitor(PhantomData))
    }
}

/// Semantics of Responses API streams: dispatch on the JSON `type` (as the SDK does), falling
/// back to the `event:` line when a server omits it.
#[derive(Debug, Default)]
pub(crate) struct ResponsesSemantics;

const RESPONSES: &str = "openai-responses";

impl ResponsesSemantics {
    /// Interpret one SSE event.
    pub(crate) fn on_sse(
        &mut self,
        sse: SseEvent<'_>,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FrameError> {
        let data = trim(sse.data);
        if data.is_empty() || data == b"[DONE]" {
            // No `[DONE]` in this API; some compatible servers add one anyway. The terminal
            // marker is `response.completed`.
            return Ok(());
        }
        let event: ResponsesEvent<'_> = parse(RESPONSES, data)?;
        let kind = match event.kind.as_str() {
            "" => sse.event.unwrap_or(""),
            kind => kind,
        };
        let content_kind = match kind {
            "response.output_text.delta" | "response.refusal.delta" => Some(ContentKind::Text),
            "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
                Some(ContentKind::Reasoning)
            }
            "response.function_call_arguments.delta"
            | "response.custom_tool_call_input.delta"
            | "response.mcp_call_arguments.delta" => Some(ContentKind::ToolCall),
            _ => None,
        };
        if let Some(kind) = content_kind {
            if let Some(text) = event.delta.non_empty() {
                on_event(Event::Content { kind, text });
            }
            return Ok(());
        }
        match kind {
            "response.completed" | "response.incomplete" | "response.failed" => {
                let response = event.response.unwrap_or_default();
                if let Some(usage) = response.usage {
                    super::emit_usage(
                        Usage {
                            input_tokens: usage.input_tokens.0,
                            output_tokens: usage.output_tokens.0,
                            cached_input_tokens: usage
                                .input_tokens_details
                                .and_then(|d| d.cached_tokens.0),
                        },
                        on_event,
                    );
                }
                if kind == "response.failed" {
                    let message = response
                        .error
                        .and_then(truthy_error_message)
                        .unwrap_or(Cow::Borrowed("response.failed"));
                    on_event(Event::Error { message });
                } else {
                    // `incomplete` (e.g. max_output_tokens) is complete-but-cut-by-limit, like
                    // a chat `finish_reason:"length"`: the stream itself ended normally.
                    on_event(Event::Terminal);
                }
            }
            "error" => {
                let message = match (event.message.non_empty(), event.code.non_empty()) {
                    (Some(message), _) => message,
                    (None, Some(code)) => code,
                    (None, None) => event
                        .error
                        .and_then(truthy_error_message)
                        .unwrap_or(Cow::Borrowed("error event")),
                };
                on_event(Event::Error { message });
            }
            _ => {}
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct ResponsesEvent<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Text<'a>,
    #[serde(default, borrow)]
    delta: Text<'a>,
    #[serde(default, borrow)]
    response: Option<ResponseObject<'a>>,
    #[serde(default, borrow)]
    message: Text<'a>,
    #[serde(default, borrow)]
    code: Text<'a>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct ResponseObject<'a> {
    #[serde(default)]
    usage: Option<ResponseUsage>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ResponseUsage {
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    output_tokens: Count,
    #[serde(default)]
    input_tokens_details: Option<CachedTokens>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(data: &str) -> Vec<String> {
        let mut semantics = ChatSemantics::new("openai-chat");
        let mut seen = Vec::new();
        semantics
            .on_sse(
                SseEvent {
                    event: None,
                    data: data.as_bytes(),
                },
                &mut |event| seen.push(format!("{event:?}")),
            )
            .expect("valid chunk");
        seen
    }

    #[test]
    fn content_text_borrows_from_the_frame() {
        let data = br#"{"choices":[{"index":0,"delta":{"content":"Hello"}}]}"#;
        let mut borrowed = false;
        ChatSemantics::new("openai-chat")
            .on_sse(SseEvent { event: None, data }, &mut |event| {
                borrowed = matches!(
                    event,
                    Event::Content {
                        text: Cow::Borrowed("Hello"),
                        ..
                    }
                );
            })
            .expect("valid chunk");
        assert!(borrowed);
    }

    #[test]
    fn first_non_empty_choice_wins_and_only_one_content_per_chunk() {
        let seen = chat(
            r#"{"choices":[{"index":0,"delta":{"content":""}},{"index":1,"delta":{"content":"b"}},{"index":2,"delta":{"content":"c"}}]}"#,
        );
        assert_eq!(seen, vec![r#"Content { kind: Text, text: "b" }"#]);
    }

    #[test]
    fn legacy_function_call_and_refusal() {
        let seen = chat(r#"{"choices":[{"delta":{"function_call":{"name":"f","arguments":""}}}]}"#);
        assert_eq!(seen, vec![r#"Content { kind: ToolCall, text: "f" }"#]);
        let seen = chat(r#"{"choices":[{"delta":{"refusal":"no"}}]}"#);
        assert_eq!(seen, vec![r#"Content { kind: Text, text: "no" }"#]);
    }

    #[test]
    fn llama_cpp_timings_are_the_servers_count() {
        // The shape of llama.cpp's last chat chunk without `include_usage`
        // (`to_json_oaicompat_chat_stream`, `result_timings::to_json`).
        let seen = chat(
            r#"{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"chatcmpl-x","model":"m","system_fingerprint":"b1","object":"chat.completion.chunk","timings":{"cache_n":3,"prompt_n":9,"prompt_ms":1.5,"prompt_per_token_ms":0.1,"prompt_per_second":600.0,"predicted_n":42,"predicted_ms":80.0,"predicted_per_token_ms":1.9,"predicted_per_second":520.0}}"#,
        );
        assert_eq!(
            seen,
            vec![
                "ServerCount(Usage { input_tokens: Some(12), output_tokens: Some(42), cached_input_tokens: Some(3) })"
            ]
        );
    }

    #[test]
    fn zero_usage_on_intermediate_chunks_is_unknown() {
        let seen = chat(
            r#"{"choices":[{"text":"a","index":0}],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}"#,
        );
        assert_eq!(seen, vec![r#"Content { kind: Text, text: "a" }"#]);
        let seen = chat(r#"{"choices":[],"usage":{"prompt_tokens":0,"completion_tokens":0}}"#);
        assert_eq!(
            seen,
            vec![
                "Usage(Usage { input_tokens: Some(0), output_tokens: Some(0), cached_input_tokens: None })"
            ]
        );
    }
}
