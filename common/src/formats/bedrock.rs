//! Amazon Bedrock stream semantics over event-stream frames: ConverseStream (wire reference
//! §4.4) and InvokeModelWithResponseStream with Anthropic models inside (§4.5), plus the
//! exception frames both can end with (§4.6).

use std::borrow::Cow;

use base64::Engine as _;
use serde::Deserialize;

use super::anthropic::AnthropicSemantics;
use super::eventstream::EsFrame;
use super::json::{Count, Text, parse};
use super::{ContentKind, Event, FrameError, Usage};

const CONVERSE: &str = "bedrock-converse";
const INVOKE: &str = "bedrock-invoke";

/// Report an `exception` or `error` frame; returns false for ordinary event frames.
pub(crate) fn on_exception(frame: &EsFrame<'_>, on_event: &mut dyn FnMut(Event<'_>)) -> bool {
    match frame.message_type {
        Some("exception") => {
            // Error path: allocating the message is fine.
            let kind = frame
                .exception_type
                .or(frame.error_code)
                .unwrap_or("exception");
            let message = serde_json::from_slice::<ExceptionPayload>(frame.payload)
                .ok()
                .and_then(|payload| payload.message.0)
                .filter(|message| !message.is_empty());
            let message = match message {
                Some(message) => format!("{kind}: {message}"),
                None => kind.to_owned(),
            };
            on_event(Event::Error {
                message: Cow::Owned(message),
            });
            true
        }
        Some("error") => {
            let message = match (frame.error_code, frame.error_message) {
                (Some(code), Some(message)) => format!("{code}: {message}"),
                (Some(text), None) | (None, Some(text)) => text.to_owned(),
                (None, None) => "error frame".to_owned(),
            };
            on_event(Event::Error {
                message: Cow::Owned(message),
            });
            true
        }
        _ => false,
    }
}

/// ConverseStream: content from `contentBlockDelta`; usage from `metadata`, which arrives
/// after `messageStop` and is the completion marker.
#[derive(Debug, Default)]
pub(crate) struct ConverseSemantics {
    message_stopped: bool,
}

impl ConverseSemantics {
    /// Interpret one event frame.
    pub(crate) fn on_frame(
        &mut self,
        frame: EsFrame<'_>,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FrameError> {
        if on_exception(&frame, on_event) {
            return Ok(());
        }
        match frame.event_type {
            Some("contentBlockDelta") => {
                let payload: DeltaPayload<'_> = parse(CONVERSE, frame.payload)?;
                let Some(delta) = payload.delta else {
                    return Ok(());
                };
                let content = delta
                    .text
                    .non_empty()
                    .map(|text| (ContentKind::Text, text))
                    .or_else(|| {
                        delta
                            .reasoning_content
                            .and_then(|r| r.text.non_empty())
                            .map(|text| (ContentKind::Reasoning, text))
                    })
                    .or_else(|| {
                        delta
                            .tool_use
                            .and_then(|t| t.input.non_empty())
                            .map(|text| (ContentKind::ToolCall, text))
                    });
                if let Some((kind, text)) = content {
                    on_event(Event::Content { kind, text });
                }
            }
            Some("messageStop") => self.message_stopped = true,
            Some("metadata") => {
                let payload: MetadataPayload = parse(CONVERSE, frame.payload)?;
                if let Some(usage) = payload.usage {
                    super::emit_usage(
                        Usage {
                            // Like Anthropic's, Bedrock's `inputTokens` leaves out the cached
                            // parts: the prompt's length is all three.
                            input_tokens: usage.input_tokens.0.map(|n| {
                                n.saturating_add(usage.cache_read_input_tokens.0.unwrap_or(0))
                                    .saturating_add(usage.cache_write_input_tokens.0.unwrap_or(0))
                            }),
                            output_tokens: usage.output_tokens.0,
                            cached_input_tokens: usage.cache_read_input_tokens.0,
                        },
                        on_event,
                    );
                }
                // Normal completion is `messageStop` *then* `metadata` (§7); metadata alone
                // does not prove the message finished.
                if self.message_stopped {
                    on_event(Event::Terminal);
                }
            }
            // messageStart, contentBlockStart/Stop, unknown types (boto3 skips them too).
            _ => {}
        }
        Ok(())
    }
}

/// InvokeModelWithResponseStream: every frame is a `chunk` whose base64 `bytes` hold one
/// Anthropic stream event as JSON (no SSE framing).
#[derive(Debug, Default)]
pub(crate) struct InvokeSemantics {
    /// The decoded inner JSON, reused across frames: base64 has to be decoded somewhere, and
    /// a reused buffer keeps that from allocating per frame.
    decoded: Vec<u8>,
    anthropic: AnthropicSemantics,
}

impl InvokeSemantics {
    /// Interpret one event frame.
    pub(crate) fn on_frame(
        &mut self,
        frame: EsFrame<'_>,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FrameError> {
        if on_exception(&frame, on_event) {
            return Ok(());
        }
        if frame.event_type != Some("chunk") {
            return Ok(());
        }
        let payload: ChunkPayload<'_> = parse(INVOKE, frame.payload)?;
        let Some(encoded) = payload.bytes.non_empty() else {
            return Ok(());
        };
        self.decoded.clear();
        base64::engine::general_purpose::STANDARD
            .decode_vec(encoded.as_bytes(), &mut self.decoded)
            .map_err(|error| FrameError::Malformed {
                family: INVOKE,
                reason: format!("chunk bytes are not base64: {error}"),
            })?;
        self.anthropic
            .on_json(INVOKE, None, &self.decoded, on_event)
    }
}

#[derive(Deserialize)]
struct ExceptionPayload<'a> {
    #[serde(default, borrow)]
    message: Text<'a>,
}

#[derive(Deserialize)]
struct DeltaPayload<'a> {
    #[serde(default, borrow)]
    delta: Option<ConverseDelta<'a>>,
}

#[derive(Deserialize)]
struct ConverseDelta<'a> {
    #[serde(default, borrow)]
    text: Text<'a>,
    #[serde(default, borrow, rename = "reasoningContent")]
    reasoning_content: Option<TextMember<'a>>,
    #[serde(default, borrow, rename = "toolUse")]
    tool_use: Option<ToolUseDelta<'a>>,
}

#[derive(Deserialize)]
struct TextMember<'a> {
    #[serde(default, borrow)]
    text: Text<'a>,
}

#[derive(Deserialize)]
struct ToolUseDelta<'a> {
    #[serde(default, borrow)]
    input: Text<'a>,
}

#[derive(Deserialize)]
struct MetadataPayload {
    #[serde(default)]
    usage: Option<ConverseUsage>,
}

#[derive(Deserialize)]
struct ConverseUsage {
    #[serde(default, rename = "inputTokens")]
    input_tokens: Count,
    #[serde(default, rename = "outputTokens")]
    output_tokens: Count,
    #[serde(default, rename = "cacheReadInputTokens")]
    cache_read_input_tokens: Count,
    #[serde(default, rename = "cacheWriteInputTokens")]
    cache_write_input_tokens: Count,
}

#[derive(Deserialize)]
struct ChunkPayload<'a> {
    #[serde(default, borrow)]
    bytes: Text<'a>,
}
