//! Anthropic Messages stream semantics (wire reference §3), shared by the SSE family and by
//! Bedrock InvokeModelWithResponseStream, whose chunks carry the same event JSON (§4.5).
//!
//! Dispatch is on the JSON `type` (the `event:` line is only a fallback), so the same code
//! serves SSE events and Bedrock's un-framed inner JSON.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{Count, Text, parse, trim, truthy_error_message};
use super::{ContentKind, Event, FrameError, Usage};

/// Per-stream state: the input-token parts from `message_start`, which a later
/// `message_delta` may override field by field.
#[derive(Debug, Default)]
pub(crate) struct AnthropicSemantics {
    input_tokens: Option<u64>,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
}

impl AnthropicSemantics {
    /// Interpret one event's JSON. `event_name` is the SSE `event:` line, if any.
    pub(crate) fn on_json(
        &mut self,
        family: &'static str,
        event_name: Option<&str>,
        json: &[u8],
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FrameError> {
        let json = trim(json);
        // Anthropic sends no `[DONE]`, but OpenAI-minded proxies append one; it is not JSON
        // and must not break the stream.
        if json.is_empty() || json == b"[DONE]" {
            return Ok(());
        }
        let event: AnthropicEvent<'_> = parse(family, json)?;
        let kind = match event.kind.as_str() {
            "" => event_name.unwrap_or(""),
            kind => kind,
        };
        match kind {
            "content_block_delta" => {
                let Some(delta) = event.delta else {
                    return Ok(());
                };
                let content = match delta.kind.as_str() {
                    "text_delta" => delta.text.non_empty().map(|t| (ContentKind::Text, t)),
                    "thinking_delta" => delta
                        .thinking
                        .non_empty()
                        .map(|t| (ContentKind::Reasoning, t)),
                    // The first fragment is often `""`: not generated output.
                    "input_json_delta" => delta
                        .partial_json
                        .non_empty()
                        .map(|t| (ContentKind::ToolCall, t)),
                    // signature_delta, citations_delta: not generated tokens.
                    _ => None,
                };
                if let Some((kind, text)) = content {
                    on_event(Event::Content { kind, text });
                }
            }
            "message_start" => {
                // Only the input: `output_tokens` here is a placeholder (1–2), not a count.
                if let Some(usage) = event.message.and_then(|m| m.usage) {
                    self.merge_input(&usage);
                    if let Some(input) = self.total_input() {
                        on_event(Event::Usage(Usage {
                            input_tokens: Some(input),
                            output_tokens: None,
                            cached_input_tokens: self.cached_input(),
                        }));
                    }
                }
            }
            "message_delta" => {
                if let Some(usage) = event.usage {
                    let repeats_input = self.merge_input(&usage);
                    super::emit_usage(
                        Usage {
                            input_tokens: if repeats_input {
                                self.total_input()
                            } else {
                                None
                            },
                            output_tokens: usage.output_tokens.0,
                            cached_input_tokens: if repeats_input {
                                self.cached_input()
                            } else {
                                None
                            },
                        },
                        on_event,
                    );
                }
            }
            "message_stop" => {
                // Bedrock Invoke adds its model-agnostic metrics to the last event.
                if let Some(metrics) = event.invocation_metrics {
                    on_event(Event::Usage(Usage {
                        input_tokens: metrics.input_token_count.0,
                        output_tokens: metrics.output_token_count.0,
                        cached_input_tokens: None,
                    }));
                }
                on_event(Event::Terminal);
            }
            "error" => {
                let message = event
                    .error
                    .and_then(truthy_error_message)
                    .unwrap_or(Cow::Borrowed("error event"));
                on_event(Event::Error { message });
            }
            "" => {
                // No `type`: a non-Anthropic model behind Bedrock Invoke (Llama `generation`,
                // Titan `outputText`, legacy Claude `completion`). Their last chunk carries the
                // invocation metrics, which are then the usage and the completion marker.
                let text = event
                    .generation
                    .non_empty()
                    .or_else(|| event.output_text.non_empty())
                    .or_else(|| event.completion.non_empty());
                if let Some(text) = text {
                    on_event(Event::Content {
                        kind: ContentKind::Text,
                        text,
                    });
                }
                if let Some(metrics) = event.invocation_metrics {
                    on_event(Event::Usage(Usage {
                        input_tokens: metrics.input_token_count.0,
                        output_tokens: metrics.output_token_count.0,
                        cached_input_tokens: None,
                    }));
                    on_event(Event::Terminal);
                }
            }
            // ping, content_block_start/stop, unknown future events.
            _ => {}
        }
        Ok(())
    }

    /// Take the input parts a usage object carries; true when it carried any.
    fn merge_input(&mut self, usage: &AnthropicUsage) -> bool {
        let mut any = false;
        if let Some(n) = usage.input_tokens.0 {
            self.input_tokens = Some(n);
            any = true;
        }
        if let Some(n) = usage.cache_creation_input_tokens.0 {
            self.cache_creation_input_tokens = n;
            any = true;
        }
        if let Some(n) = usage.cache_read_input_tokens.0 {
            self.cache_read_input_tokens = n;
            any = true;
        }
        any
    }

    /// Cache reads, once the input is known (a report without them read none).
    fn cached_input(&self) -> Option<u64> {
        self.input_tokens.map(|_| self.cache_read_input_tokens)
    }

    /// Total input: uncached + cache writes + cache reads.
    fn total_input(&self) -> Option<u64> {
        self.input_tokens.map(|n| {
            n.saturating_add(self.cache_creation_input_tokens)
                .saturating_add(self.cache_read_input_tokens)
        })
    }
}

#[derive(Deserialize)]
struct AnthropicEvent<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Text<'a>,
    #[serde(default)]
    message: Option<MessageStart>,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<AnthropicUsage>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
    #[serde(default, rename = "amazon-bedrock-invocationMetrics")]
    invocation_metrics: Option<InvocationMetrics>,
    #[serde(default, borrow)]
    generation: Text<'a>,
    #[serde(default, borrow, rename = "outputText")]
    output_text: Text<'a>,
    #[serde(default, borrow)]
    completion: Text<'a>,
}

#[derive(Deserialize)]
struct MessageStart {
    #[serde(default)]
    usage: Option<AnthropicUsage>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Text<'a>,
    #[serde(default, borrow)]
    text: Text<'a>,
    #[serde(default, borrow)]
    thinking: Text<'a>,
    #[serde(default, borrow)]
    partial_json: Text<'a>,
}

#[derive(Deserialize)]
struct AnthropicUsage {
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    cache_creation_input_tokens: Count,
    #[serde(default)]
    cache_read_input_tokens: Count,
    #[serde(default)]
    output_tokens: Count,
}

#[derive(Deserialize)]
struct InvocationMetrics {
    #[serde(default, rename = "inputTokenCount")]
    input_token_count: Count,
    #[serde(default, rename = "outputTokenCount")]
    output_token_count: Count,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(semantics: &mut AnthropicSemantics, json: &str) -> Vec<String> {
        let mut seen = Vec::new();
        semantics
            .on_json("anthropic", None, json.as_bytes(), &mut |event| {
                seen.push(format!("{event:?}"))
            })
            .expect("valid event");
        seen
    }

    #[test]
    fn cache_tokens_count_as_input_and_message_delta_overrides() {
        let mut semantics = AnthropicSemantics::default();
        let seen = run(
            &mut semantics,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":5,"cache_creation_input_tokens":100,"cache_read_input_tokens":20,"output_tokens":1}}}"#,
        );
        assert_eq!(
            seen,
            vec![
                "Usage(Usage { input_tokens: Some(125), output_tokens: None, cached_input_tokens: Some(20) })"
            ]
        );
        let seen = run(
            &mut semantics,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":6,"output_tokens":30}}"#,
        );
        assert_eq!(
            seen,
            vec![
                "Usage(Usage { input_tokens: Some(126), output_tokens: Some(30), cached_input_tokens: Some(20) })"
            ]
        );
    }

    #[test]
    fn a_usage_without_counts_is_not_reported() {
        let mut semantics = AnthropicSemantics::default();
        let seen = run(
            &mut semantics,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{}}"#,
        );
        assert!(seen.is_empty(), "{seen:?}");
    }

    #[test]
    fn a_proxy_done_sentinel_is_ignored() {
        let mut semantics = AnthropicSemantics::default();
        assert!(run(&mut semantics, "[DONE]").is_empty());
    }

    #[test]
    fn event_name_is_the_fallback_for_a_missing_type() {
        let mut semantics = AnthropicSemantics::default();
        let mut seen = Vec::new();
        semantics
            .on_json("anthropic", Some("message_stop"), b"{}", &mut |event| {
                seen.push(format!("{event:?}"))
            })
            .expect("valid event");
        assert_eq!(seen, vec!["Terminal"]);
    }
}
