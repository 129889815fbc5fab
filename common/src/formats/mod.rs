//! The wire formats of the four response families, in one place.
//!
//! No code outside this module knows a wire format. It holds:
//! - [`Family`] and [`detect`]: recognise a family from the request path, the response
//!   content type and the first bytes of the stream;
//! - [`StreamParser`]: an incremental parser per family that accepts any byte split and reports
//!   [`Event`]s (content frames, usage, the terminal marker, error frames);
//! - the encoders the mock server uses to write byte-correct streams (`encode`).
//!
//! The parser never allocates per frame on the hot path: it reuses its line/frame buffers and
//! hands out borrowed text.

use std::borrow::Cow;

mod anthropic;
mod bedrock;
pub mod encode;
mod eventstream;
mod ndjson;
mod ollama;
mod openai;
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

fn detect_impl(_path: &str, _content_type: Option<&str>, _first_bytes: &[u8]) -> Option<Family> {
    None
}

struct ParserImpl;

impl ParserImpl {
    fn new(_family: Family) -> Self {
        ParserImpl
    }

    fn feed(
        &mut self,
        _bytes: &[u8],
        _on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FrameError> {
        Ok(())
    }

    fn finish(&mut self, _on_event: &mut dyn FnMut(Event<'_>)) -> Ending {
        Ending::Clean
    }
}
