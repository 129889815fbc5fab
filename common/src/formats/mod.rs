//! The wire formats of the four response families, in one place.
//!
//! No code outside this module knows a wire format. It holds:
//! - [`Family`] and [`detect`]: recognise a family from the request path, the response
//!   content type and the first bytes of the stream;
//! - [`StreamParser`]: an incremental parser per family that accepts any byte split and reports
//!   [`Event`]s (content frames, usage, the terminal marker, error frames);
//! - the encoders the mock server uses to write byte-correct streams (`encode`);
//! - what a request body says (`request`: prompt text, max tokens, model, stream flag);
//! - whether a response reached its end (`complete`: the terminal marker, a whole body).
//! - the request fields that limit a family's output length (`pin`, `--pin-output-length`).
//!
//! The parser never allocates per frame on the hot path: it reuses its line/frame buffers and
//! hands out borrowed text.

use std::borrow::Cow;

mod anthropic;
mod bedrock;
pub mod complete;
pub mod encode;
mod eventstream;
mod ndjson;
mod ollama;
mod openai;
pub mod pin;
pub mod request;
mod sse;

/// A response family, as recognised from the stream itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// OpenAI-compatible `/v1/chat/completions` SSE.
    OpenAiChat,
    /// OpenAI-compatible legacy `/v1/completions` SSE.
    OpenAiCompletions,
    /// OpenAI Responses API (`/v1/responses`) SSE with named events.
    OpenAiResponses,
    /// Anthropic Messages SSE (`/v1/messages`).
    Anthropic,
    /// Ollama native NDJSON (`/api/chat`, `/api/generate`).
    Ollama,
    /// Amazon Bedrock `ConverseStream` event-stream.
    BedrockConverse,
    /// Amazon Bedrock `InvokeModelWithResponseStream` event-stream (Anthropic models inside).
    BedrockInvoke,
}

impl Family {
    /// Stable lower-case name used in reports and recordings' stats.
    pub fn name(self) -> &'static str {
        match self {
            Family::OpenAiChat => "openai-chat",
            Family::OpenAiCompletions => "openai-completions",
            Family::OpenAiResponses => "openai-responses",
            Family::Anthropic => "anthropic",
            Family::Ollama => "ollama",
            Family::BedrockConverse => "bedrock-converse",
            Family::BedrockInvoke => "bedrock-invoke",
        }
    }
}

/// What kind of generated output a content frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentKind {
    /// Visible text.
    Text,
    /// Reasoning / thinking text.
    Reasoning,
    /// A tool-call delta (name or argument fragment).
    ToolCall,
}

/// Token counts from the server's own usage report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt (input) tokens, when the report has them.
    pub input_tokens: Option<u64>,
    /// Generated (output) tokens including reasoning, when the report has them.
    pub output_tokens: Option<u64>,
    /// Input tokens served from the server's prompt cache (OpenAI
    /// `prompt_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`, Bedrock
    /// `cacheReadInputTokens`), when the report has them. Part of `input_tokens`.
    pub cached_input_tokens: Option<u64>,
}

/// One thing the parser recognised in the stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Event<'a> {
    /// A wire frame that carries generated content. At most one per wire frame, so the number
    /// of `Content` events is the number of content frames (the token estimate when no usage
    /// comes). `text` is the frame's generated text of that kind (may be empty for tool-call
    /// starts that only carry a name, in which case the name is given).
    Content {
        kind: ContentKind,
        text: Cow<'a, str>,
    },
    /// A usage report. Reports are cumulative: a later one replaces an earlier one, never sums.
    Usage(Usage),
    /// A count the server stated outside a usage report: llama.cpp's `timings`
    /// (`predicted_n` output tokens; `prompt_n` + `cache_n` input tokens, `cache_n` of them
    /// from its prompt cache), on the last chunk of a stream that did not ask for usage, or on
    /// every chunk with `timings_per_token`. Cumulative like usage: the last one wins. A usage
    /// report, when one comes, is believed before it.
    ServerCount(Usage),
    /// The family's terminal marker arrived: the stream completed normally.
    Terminal,
    /// An error frame: the stream failed, whatever follows (`[DONE]` after an error is still a
    /// failure).
    Error { message: Cow<'a, str> },
}

/// How the byte stream itself ended, reported by [`StreamParser::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Every byte belonged to a whole frame.
    Clean,
    /// Bytes of an unfinished frame were left at the end (a cut stream).
    TrailingPartialFrame,
}

/// A stream's framing was broken beyond recovery (bad CRC, a frame over the size cap, bytes
/// that are not the family's framing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("event-stream frame of {len} bytes is over the {cap}-byte cap")]
    FrameTooLarge { len: usize, cap: usize },
    #[error("event-stream checksum mismatch")]
    Checksum,
    #[error("malformed {family} frame: {reason}")]
    Malformed {
        family: &'static str,
        reason: String,
    },
}

/// Recognise the response family from what a client sees: the request path, the response
/// `content-type`, and the first bytes of the body (any prefix, possibly empty).
///
/// Returns `None` when nothing identifies a family (e.g. a plain JSON non-streamed body).
pub fn detect(path: &str, content_type: Option<&str>, first_bytes: &[u8]) -> Option<Family> {
    detect_impl(path, content_type, first_bytes)
}

/// Incremental parser for one response stream of one family.
///
/// Feed it every network read in order with [`StreamParser::feed`]; it calls `on_event` for
/// every event completed by those bytes, whatever the split. Call [`StreamParser::finish`] at
/// end of stream.
pub struct StreamParser {
    inner: ParserImpl,
}

impl StreamParser {
    /// A parser for `family`.
    pub fn new(family: Family) -> Self {
        StreamParser {
            inner: ParserImpl::new(family),
        }
    }

    /// Parse the bytes of one network read.
    pub fn feed(
        &mut self,
        bytes: &[u8],
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FrameError> {
        self.inner.feed(bytes, on_event)
    }

    /// The stream ended: flush and report whether an unfinished frame was left.
    pub fn finish(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Ending {
        self.inner.finish(on_event)
    }
}

// --- placeholder implementation, replaced by the per-family parsers ---

// The per-family parsers. Declared here (not with the other `mod` lines above) because this
// section is the one the formats work owns.
mod detect;
mod json;
mod unstreamed;

pub use detect::{family_for_path, is_streaming_content_type, response_is_streamed};
pub use eventstream::MAX_EVENT_STREAM_FRAME_BYTES;
pub use unstreamed::{Unstreamed, unstreamed};

/// Report a usage that says something: a report with neither count would only tell the meter
/// "usage seen" without a number.
fn emit_usage(usage: Usage, on_event: &mut dyn FnMut(Event<'_>)) {
    if usage.input_tokens.is_some()
        || usage.output_tokens.is_some()
        || usage.cached_input_tokens.is_some()
    {
        on_event(Event::Usage(usage));
    }
}

/// Report a server-stated count that says something (see [`Event::ServerCount`]).
fn emit_server_count(count: Usage, on_event: &mut dyn FnMut(Event<'_>)) {
    if count.input_tokens.is_some() || count.output_tokens.is_some() {
        on_event(Event::ServerCount(count));
    }
}

fn detect_impl(path: &str, content_type: Option<&str>, first_bytes: &[u8]) -> Option<Family> {
    detect::detect(path, content_type, first_bytes)
}

/// A framing layer and the family semantics on top of it. The two live in separate fields so
/// the semantics can read the framing layer's borrowed buffers while both are borrowed.
enum ParserImpl {
    Sse {
        decoder: sse::SseDecoder,
        semantics: SseSemantics,
    },
    Ndjson {
        decoder: ndjson::NdjsonDecoder,
        semantics: ollama::OllamaSemantics,
    },
    EventStream {
        decoder: eventstream::EventStreamDecoder,
        semantics: EventStreamSemantics,
    },
}

enum SseSemantics {
    /// Chat and legacy completions (one parser, the family name differs in errors).
    Chat(openai::ChatSemantics),
    Responses(openai::ResponsesSemantics),
    Anthropic(anthropic::AnthropicSemantics),
}

enum EventStreamSemantics {
    Converse(bedrock::ConverseSemantics),
    Invoke(bedrock::InvokeSemantics),
}

impl SseSemantics {
    fn on_sse(
        &mut self,
        event: sse::SseEvent<'_>,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FrameError> {
        match self {
            SseSemantics::Chat(semantics) => semantics.on_sse(event, on_event),
            SseSemantics::Responses(semantics) => semantics.on_sse(event, on_event),
            SseSemantics::Anthropic(semantics) => {
                semantics.on_json(Family::Anthropic.name(), event.event, event.data, on_event)
            }
        }
    }
}

impl EventStreamSemantics {
    fn on_frame(
        &mut self,
        frame: eventstream::EsFrame<'_>,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FrameError> {
        match self {
            EventStreamSemantics::Converse(semantics) => semantics.on_frame(frame, on_event),
            EventStreamSemantics::Invoke(semantics) => semantics.on_frame(frame, on_event),
        }
    }
}

impl ParserImpl {
    fn new(family: Family) -> Self {
        let sse = |semantics| ParserImpl::Sse {
            decoder: sse::SseDecoder::default(),
            semantics,
        };
        let event_stream = |semantics| ParserImpl::EventStream {
            decoder: eventstream::EventStreamDecoder::default(),
            semantics,
        };
        match family {
            Family::OpenAiChat | Family::OpenAiCompletions => sse(SseSemantics::Chat(
                openai::ChatSemantics::new(family.name()),
            )),
            Family::OpenAiResponses => sse(SseSemantics::Responses(openai::ResponsesSemantics)),
            Family::Anthropic => sse(SseSemantics::Anthropic(
                anthropic::AnthropicSemantics::default(),
            )),
            Family::Ollama => ParserImpl::Ndjson {
                decoder: ndjson::NdjsonDecoder::default(),
                semantics: ollama::OllamaSemantics,
            },
            Family::BedrockConverse => event_stream(EventStreamSemantics::Converse(
                bedrock::ConverseSemantics::default(),
            )),
            Family::BedrockInvoke => event_stream(EventStreamSemantics::Invoke(
                bedrock::InvokeSemantics::default(),
            )),
        }
    }

    fn feed(
        &mut self,
        bytes: &[u8],
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FrameError> {
        match self {
            ParserImpl::Sse { decoder, semantics } => {
                decoder.feed(bytes, &mut |event| semantics.on_sse(event, on_event))
            }
            ParserImpl::Ndjson { decoder, semantics } => {
                decoder.feed(bytes, &mut |line| semantics.on_line(line, on_event))
            }
            ParserImpl::EventStream { decoder, semantics } => {
                decoder.feed(bytes, &mut |frame| semantics.on_frame(frame, on_event))
            }
        }
    }

    fn finish(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Ending {
        match self {
            ParserImpl::Sse { decoder, .. } => decoder.finish(),
            ParserImpl::Ndjson { decoder, semantics } => {
                let ending = match decoder.leftover() {
                    // Go's `c.JSON` (Ollama's `load`/`unload` replies) writes one object with
                    // no trailing newline, and the Python client parses an unterminated last
                    // line; a leftover that is a whole JSON value is therefore a frame, not a
                    // cut one.
                    ndjson::Leftover::Line(line)
                        if serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok() =>
                    {
                        match semantics.on_line(line, on_event) {
                            Ok(()) => Ending::Clean,
                            Err(_) => Ending::TrailingPartialFrame,
                        }
                    }
                    leftover => leftover.ending(),
                };
                decoder.clear();
                ending
            }
            ParserImpl::EventStream { decoder, .. } => {
                let ending = if decoder.has_partial_frame() {
                    Ending::TrailingPartialFrame
                } else {
                    Ending::Clean
                };
                decoder.clear();
                ending
            }
        }
    }
}
