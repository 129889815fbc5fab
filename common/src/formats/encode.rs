//! Encoders that write byte-correct response streams of every family (the mock server's output).
//!
//! All wire knowledge for *writing* lives here; the mock server only decides what to say and
//! when. Each encoder appends to a caller-owned `Vec<u8>` so a caller can pre-encode a whole
//! stream into one buffer and hand out zero-copy slices of it, one per frame.
//!
//! The frames are modelled byte for byte on the literal, SDK-tested frames of the wire
//! reference (OpenAI §2.3/§2.6/§2.9, Anthropic §3.2, Bedrock §4.3–4.5, Ollama §5.2), minus the
//! random padding fields (`obfuscation`, Bedrock `p`) which clients ignore.
//!
//! What "usage off" ([`StreamParams::usage`] = false) does per family:
//! - OpenAI chat / completions: no `"usage":null` on chunks and no usage chunk (as when the
//!   client does not ask for `stream_options.include_usage`).
//! - OpenAI Responses: `response.completed.response.usage` is `null` (the SDK accepts it).
//! - Anthropic: no effect. The SDK needs `message_start.message.usage` and
//!   `message_delta.usage.output_tokens` (omitting them raises `AttributeError`).
//! - Ollama: the final line has no `prompt_eval_count`, `eval_count` and their durations, as
//!   Go's `omitempty` does for zeros; the client treats them as absent.
//! - Bedrock ConverseStream: `metadata` keeps `metrics` but carries no `usage`.
//! - Bedrock InvokeModelWithResponseStream: the inner Anthropic events keep their usage (the
//!   `anthropic` SDK needs it) but `message_stop` has no `amazon-bedrock-invocationMetrics`.

use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine;

use super::Family;

/// One concrete wire protocol the mock can speak (a [`Family`] plus, for Ollama and Bedrock,
/// which endpoint shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wire {
    /// `POST /v1/chat/completions`.
    OpenAiChat,
    /// `POST /v1/completions`.
    OpenAiCompletions,
    /// `POST /v1/responses`.
    OpenAiResponses,
    /// `POST /v1/messages`.
    Anthropic,
    /// `POST /api/chat`.
    OllamaChat,
    /// `POST /api/generate`.
    OllamaGenerate,
    /// `POST /model/{id}/converse-stream`.
    BedrockConverse,
    /// `POST /model/{id}/invoke-with-response-stream` with an Anthropic model inside.
    BedrockInvokeAnthropic,
}

impl Wire {
    /// The response family this wire belongs to.
    pub fn family(self) -> Family {
        match self {
            Wire::OpenAiChat => Family::OpenAiChat,
            Wire::OpenAiCompletions => Family::OpenAiCompletions,
            Wire::OpenAiResponses => Family::OpenAiResponses,
            Wire::Anthropic => Family::Anthropic,
            Wire::OllamaChat | Wire::OllamaGenerate => Family::Ollama,
            Wire::BedrockConverse => Family::BedrockConverse,
            Wire::BedrockInvokeAnthropic => Family::BedrockInvoke,
        }
    }

    /// The wire of a request path, if a stream can be encoded for it: the path's family by
    /// the one path table ([`super::family_for_path`]: any prefix, query or trailing slash)
    /// and, where a family has several endpoints, which one. Bedrock's non-streaming
    /// operations (`/converse`, `/invoke`) have no wire.
    pub fn from_path(path: &str) -> Option<Wire> {
        let family = super::family_for_path(path)?;
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        match family {
            Family::OpenAiChat => Some(Wire::OpenAiChat),
            Family::OpenAiCompletions => Some(Wire::OpenAiCompletions),
            Family::OpenAiResponses => Some(Wire::OpenAiResponses),
            Family::Anthropic => Some(Wire::Anthropic),
            Family::Ollama if path.ends_with("/api/chat") => Some(Wire::OllamaChat),
            Family::Ollama => Some(Wire::OllamaGenerate),
            Family::BedrockConverse => path
                .ends_with("/converse-stream")
                .then_some(Wire::BedrockConverse),
            Family::BedrockInvoke => path
                .ends_with("/invoke-with-response-stream")
                .then_some(Wire::BedrockInvokeAnthropic),
        }
    }

    /// `Content-Type` of a streamed response.
    pub fn stream_content_type(self) -> &'static str {
        match self {
            Wire::OpenAiChat
            | Wire::OpenAiCompletions
            | Wire::OpenAiResponses
            | Wire::Anthropic => "text/event-stream; charset=utf-8",
            Wire::OllamaChat | Wire::OllamaGenerate => "application/x-ndjson",
            Wire::BedrockConverse | Wire::BedrockInvokeAnthropic => {
                "application/vnd.amazon.eventstream"
            }
        }
    }

    /// Extra response headers the family's clients expect on a stream (beyond content type).
    pub fn stream_extra_headers(self) -> &'static [(&'static str, &'static str)] {
        match self {
            // `contentType` output member of InvokeModelWithResponseStream (§4.2).
            Wire::BedrockInvokeAnthropic => &[("x-amzn-bedrock-content-type", "application/json")],
            _ => &[],
        }
    }

    /// True for the Bedrock wires, which always stream (the path decides, there is no flag).
    pub fn always_streams(self) -> bool {
        matches!(self, Wire::BedrockConverse | Wire::BedrockInvokeAnthropic)
    }
}

/// Why generation stopped, mapped to each family's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// Natural end (`stop`, `end_turn`).
    Stop,
    /// The token limit was reached (`length`, `max_tokens`).
    Length,
}

/// Server-side timings some families report in their final frame (Ollama durations, Bedrock
/// latency metrics). Planned values are fine: they describe the mock's own schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerTimings {
    /// Whole request, nanoseconds.
    pub total_ns: u64,
    /// Model load, nanoseconds.
    pub load_ns: u64,
    /// Prompt evaluation (time to first token), nanoseconds.
    pub prompt_eval_ns: u64,
    /// Generation, nanoseconds.
    pub eval_ns: u64,
}

/// Everything about one stream that does not change from frame to frame.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamParams {
    /// Id suffix; each family adds its prefix (`chatcmpl-`, `cmpl-`, `resp_`, `msg_`).
    pub id: String,
    /// Model name echoed in frames.
    pub model: String,
    /// Creation time, Unix milliseconds (OpenAI `created` uses the seconds).
    pub created_unix_ms: u64,
    /// Prompt tokens to report.
    pub input_tokens: u64,
    /// Whether to report usage (see the module docs for what `false` does per family).
    pub usage: bool,
    /// OpenAI `system_fingerprint`.
    pub system_fingerprint: String,
    /// Timings reported by Ollama and Bedrock.
    pub timings: ServerTimings,
}

/// Appends one stream's frames, in order: [`StreamEncoder::preamble`], then one
/// [`StreamEncoder::token`] per token, then either [`StreamEncoder::finish`] or
/// [`StreamEncoder::error_frame`].
///
/// Every method appends whole frames only, so the caller may cut `out` between calls.
pub struct StreamEncoder {
    wire: Wire,
    params: StreamParams,
    /// RFC 3339 `created_at` for Ollama lines.
    created_at: String,
    /// Responses API `sequence_number` of the next event.
    sequence: u64,
    /// Text so far; the Responses API repeats it in its `done` events and the OpenAI legacy
    /// completions puts `finish_reason` on the last text chunk, so that one is delayed.
    text: String,
    tokens: u64,
    /// Scratch buffer for JSON payloads that get wrapped (Bedrock frames).
    scratch: Vec<u8>,
    /// Write llama.cpp's `timings` on the last chunk of an OpenAI chat or completions
    /// stream ([`StreamEncoder::with_llama_timings`]).
    llama_timings: bool,
}

impl StreamEncoder {
    /// An encoder for one stream.
    pub fn new(wire: Wire, params: StreamParams) -> StreamEncoder {
        let created_at = rfc3339_from_unix_ms(params.created_unix_ms);
        StreamEncoder {
            wire,
            params,
            created_at,
            sequence: 0,
            text: String::new(),
            tokens: 0,
            scratch: Vec::with_capacity(256),
            llama_timings: false,
        }
    }

    /// Speak like llama.cpp's server on OpenAI chat and completions streams: the last chunk
    /// (the usage chunk when usage is on, else the finish chunk) carries `timings` with the
    /// server's counts (`prompt_n`, `cache_n`, `predicted_n` = the `output_tokens` given to
    /// [`StreamEncoder::finish`]), as its `to_json_oaicompat_chat_stream` writes them.
    pub fn with_llama_timings(mut self) -> StreamEncoder {
        self.llama_timings = true;
        self
    }

    /// The wire this encoder writes.
    pub fn wire(&self) -> Wire {
        self.wire
    }

    /// Override Ollama's `created_at` for the following lines (RFC 3339 text).
    pub fn set_created_at(&mut self, created_at: &str) {
        self.created_at.clear();
        self.created_at.push_str(created_at);
    }

    /// Frames before the first token: OpenAI chat's role chunk, the Responses lifecycle
    /// opening, Anthropic's `message_start` + `content_block_start`, Bedrock's `messageStart`.
    /// Nothing for legacy completions and Ollama, whose first frame carries the first token.
    pub fn preamble(&mut self, out: &mut Vec<u8>) {
        match self.wire {
            Wire::OpenAiChat => {
                self.chat_chunk_head(out);
                out.extend_from_slice(
                    br#""choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]"#,
                );
                self.chat_chunk_tail(out);
            }
            Wire::OpenAiResponses => {
                for kind in ["response.created", "response.in_progress"] {
                    self.responses_event_head(kind, out);
                    out.extend_from_slice(br#","response":"#);
                    self.responses_object("in_progress", None, false, out);
                    out.extend_from_slice(b"}\n\n");
                }
                self.responses_event_head("response.output_item.added", out);
                out.extend_from_slice(br#","output_index":0,"item":{"id":"#);
                self.push_msg_item_id(out);
                out.extend_from_slice(
                    br#","type":"message","status":"in_progress","content":[],"role":"assistant"}}"#,
                );
                out.extend_from_slice(b"\n\n");
                self.responses_event_head("response.content_part.added", out);
                self.responses_item_ref(out);
                out.extend_from_slice(
                    br#","part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}}"#,
                );
                out.extend_from_slice(b"\n\n");
            }
            Wire::Anthropic | Wire::BedrockInvokeAnthropic => {
                let mut json = std::mem::take(&mut self.scratch);
                json.clear();
                json.extend_from_slice(br#"{"type":"message_start","message":{"id":"msg_"#);
                push_json_str_body(&mut json, &self.params.id, false);
                json.extend_from_slice(br#"","type":"message","role":"assistant","model":"#);
                push_json_str(&mut json, &self.params.model, false);
                json.extend_from_slice(
                    br#","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":"#,
                );
                push_u64(&mut json, self.params.input_tokens);
                json.extend_from_slice(
                    br#","cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1,"service_tier":"standard"}}}"#,
                );
                self.anthropic_event("message_start", &json, out);
                json.clear();
                json.extend_from_slice(
                    br#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                );
                self.anthropic_event("content_block_start", &json, out);
                self.scratch = json;
            }
            Wire::BedrockConverse => {
                bedrock_event_frame("messageStart", br#"{"role":"assistant"}"#, out);
            }
            Wire::OpenAiCompletions | Wire::OllamaChat | Wire::OllamaGenerate => {}
        }
    }

    /// Anthropic's keep-alive `ping` event (as the real API writes it, with a space).
    /// Nothing on other wires.
    pub fn ping(&mut self, out: &mut Vec<u8>) {
        if self.wire == Wire::Anthropic {
            out.extend_from_slice(b"event: ping\ndata: {\"type\": \"ping\"}\n\n");
        }
    }

    /// One content frame carrying `text`.
    ///
    /// Legacy completions put `finish_reason` on the last text chunk, so for that wire the
    /// caller must pass `last = true` on the final token; other wires ignore `last`.
    pub fn token(&mut self, text: &str, last_finish: Option<Finish>, out: &mut Vec<u8>) {
        self.tokens += 1;
        match self.wire {
            Wire::OpenAiChat => {
                self.chat_chunk_head(out);
                out.extend_from_slice(br#""choices":[{"index":0,"delta":{"content":"#);
                push_json_str(out, text, false);
                out.extend_from_slice(br#"},"logprobs":null,"finish_reason":null}]"#);
                self.chat_chunk_tail(out);
            }
            Wire::OpenAiCompletions => {
                self.completions_chunk_head(out);
                out.extend_from_slice(br#""choices":[{"text":"#);
                push_json_str(out, text, false);
                out.extend_from_slice(br#","index":0,"logprobs":null,"finish_reason":"#);
                match last_finish {
                    Some(finish) => {
                        push_json_str(out, openai_finish(finish), false);
                    }
                    None => out.extend_from_slice(b"null"),
                }
                out.extend_from_slice(b"}]");
                self.completions_chunk_tail(out);
            }
            Wire::OpenAiResponses => {
                self.text.push_str(text);
                self.responses_event_head("response.output_text.delta", out);
                self.responses_item_ref(out);
                out.extend_from_slice(br#","delta":"#);
                push_json_str(out, text, false);
                out.extend_from_slice(br#","logprobs":[]}"#);
                out.extend_from_slice(b"\n\n");
            }
            Wire::Anthropic | Wire::BedrockInvokeAnthropic => {
                let mut json = std::mem::take(&mut self.scratch);
                json.clear();
                json.extend_from_slice(
                    br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"#,
                );
                push_json_str(&mut json, text, false);
                json.extend_from_slice(b"}}");
                self.anthropic_event("content_block_delta", &json, out);
                self.scratch = json;
            }
            Wire::OllamaChat => {
                self.ollama_head(out);
                out.extend_from_slice(br#","message":{"role":"assistant","content":"#);
                push_json_str(out, text, true);
                out.extend_from_slice(b"},\"done\":false}\n");
            }
            Wire::OllamaGenerate => {
                self.ollama_head(out);
                out.extend_from_slice(br#","response":"#);
                push_json_str(out, text, true);
                out.extend_from_slice(b",\"done\":false}\n");
            }
            Wire::BedrockConverse => {
                let mut json = std::mem::take(&mut self.scratch);
                json.clear();
                json.extend_from_slice(br#"{"contentBlockIndex":0,"delta":{"text":"#);
                push_json_str(&mut json, text, false);
                json.extend_from_slice(b"}}");
                bedrock_event_frame("contentBlockDelta", &json, out);
                self.scratch = json;
            }
        }
    }

    /// Frames after the last token: finish/usage/`[DONE]`, the Responses `done` events and
    /// `response.completed`, Anthropic's stop/`message_delta`/`message_stop`, Ollama's
    /// `done:true` line, Bedrock's `contentBlockStop`/`messageStop`/`metadata`.
    ///
    /// `output_tokens` is the count reported in usage (normally the number of tokens sent).
    pub fn finish(&mut self, finish: Finish, output_tokens: u64, out: &mut Vec<u8>) {
        let input = self.params.input_tokens;
        match self.wire {
            Wire::OpenAiChat => {
                self.chat_chunk_head(out);
                out.extend_from_slice(
                    br#""choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"#,
                );
                push_json_str(out, openai_finish(finish), false);
                out.extend_from_slice(b"}]");
                if !self.params.usage {
                    self.push_llama_timings(output_tokens, out);
                }
                self.chat_chunk_tail(out);
                if self.params.usage {
                    self.chat_chunk_head(out);
                    self.openai_usage_chunk_rest(true, output_tokens, out);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
            Wire::OpenAiCompletions => {
                if self.tokens == 0 || (self.llama_timings && !self.params.usage) {
                    // No text chunk carried the finish reason: send it on an empty one.
                    self.completions_chunk_head(out);
                    out.extend_from_slice(
                        br#""choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"#,
                    );
                    push_json_str(out, openai_finish(finish), false);
                    out.extend_from_slice(b"}]");
                    if !self.params.usage {
                        self.push_llama_timings(output_tokens, out);
                    }
                    self.completions_chunk_tail(out);
                }
                if self.params.usage {
                    self.completions_chunk_head(out);
                    self.openai_usage_chunk_rest(false, output_tokens, out);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
            Wire::OpenAiResponses => {
                let text = std::mem::take(&mut self.text);
                self.responses_event_head("response.output_text.done", out);
                self.responses_item_ref(out);
                out.extend_from_slice(br#","text":"#);
                push_json_str(out, &text, false);
                out.extend_from_slice(br#","logprobs":[]}"#);
                out.extend_from_slice(b"\n\n");
                self.responses_event_head("response.content_part.done", out);
                self.responses_item_ref(out);
                out.extend_from_slice(br#","part":"#);
                push_output_text_part(out, &text);
                out.extend_from_slice(b"}\n\n");
                self.responses_event_head("response.output_item.done", out);
                out.extend_from_slice(br#","output_index":0,"item":"#);
                self.push_message_item(&text, out);
                out.extend_from_slice(b"}\n\n");
                self.responses_event_head("response.completed", out);
                out.extend_from_slice(br#","response":"#);
                let usage = self.params.usage.then_some((input, output_tokens));
                self.text = text;
                self.responses_object("completed", usage, true, out);
                out.extend_from_slice(b"}\n\n");
            }
            Wire::Anthropic | Wire::BedrockInvokeAnthropic => {
                let mut json = std::mem::take(&mut self.scratch);
                json.clear();
                json.extend_from_slice(br#"{"type":"content_block_stop","index":0}"#);
                self.anthropic_event("content_block_stop", &json, out);
                json.clear();
                json.extend_from_slice(br#"{"type":"message_delta","delta":{"stop_reason":"#);
                push_json_str(&mut json, anthropic_finish(finish), false);
                json.extend_from_slice(br#","stop_sequence":null},"usage":{"output_tokens":"#);
                push_u64(&mut json, output_tokens);
                json.extend_from_slice(b"}}");
                self.anthropic_event("message_delta", &json, out);
                json.clear();
                json.extend_from_slice(br#"{"type":"message_stop""#);
                if self.wire == Wire::BedrockInvokeAnthropic && self.params.usage {
                    let t = self.params.timings;
                    json.extend_from_slice(
                        br#","amazon-bedrock-invocationMetrics":{"inputTokenCount":"#,
                    );
                    push_u64(&mut json, input);
                    json.extend_from_slice(br#","outputTokenCount":"#);
                    push_u64(&mut json, output_tokens);
                    json.extend_from_slice(br#","invocationLatency":"#);
                    push_u64(&mut json, t.total_ns / 1_000_000);
                    json.extend_from_slice(br#","firstByteLatency":"#);
                    push_u64(&mut json, t.prompt_eval_ns / 1_000_000);
                    json.push(b'}');
                }
                json.push(b'}');
                self.anthropic_event("message_stop", &json, out);
                self.scratch = json;
            }
            Wire::OllamaChat | Wire::OllamaGenerate => {
                self.ollama_head(out);
                if self.wire == Wire::OllamaChat {
                    out.extend_from_slice(br#","message":{"role":"assistant","content":""}"#);
                } else {
                    out.extend_from_slice(br#","response":"""#);
                }
                out.extend_from_slice(br#","done":true,"done_reason":"#);
                push_json_str(out, openai_finish(finish), false);
                self.ollama_metrics(output_tokens, out);
                out.extend_from_slice(b"}\n");
            }
            Wire::BedrockConverse => {
                bedrock_event_frame("contentBlockStop", br#"{"contentBlockIndex":0}"#, out);
                let mut json = std::mem::take(&mut self.scratch);
                json.clear();
                json.extend_from_slice(br#"{"stopReason":"#);
                push_json_str(&mut json, anthropic_finish(finish), false);
                json.push(b'}');
                bedrock_event_frame("messageStop", &json, out);
                json.clear();
                json.extend_from_slice(br#"{"metrics":{"latencyMs":"#);
                push_u64(&mut json, self.params.timings.total_ns / 1_000_000);
                json.push(b'}');
                if self.params.usage {
                    json.extend_from_slice(br#","usage":{"inputTokens":"#);
                    push_u64(&mut json, input);
                    json.extend_from_slice(br#","outputTokens":"#);
                    push_u64(&mut json, output_tokens);
                    json.extend_from_slice(br#","totalTokens":"#);
                    push_u64(&mut json, input + output_tokens);
                    json.push(b'}');
                }
                json.push(b'}');
                bedrock_event_frame("metadata", &json, out);
                self.scratch = json;
            }
        }
    }

    /// A mid-stream error in the family's own shape, after which the stream must end:
    /// OpenAI `data: {"error":…}` followed by `data: [DONE]` (as vLLM does), Responses
    /// `event: error` + `response.failed`, Anthropic `event: error`, Ollama `{"error":…}`,
    /// Bedrock a `modelStreamErrorException` exception frame.
    pub fn error_frame(&mut self, message: &str, out: &mut Vec<u8>) {
        match self.wire {
            Wire::OpenAiChat | Wire::OpenAiCompletions => {
                out.extend_from_slice(br#"data: {"error":{"message":"#);
                push_json_str(out, message, false);
                out.extend_from_slice(br#","type":"server_error","param":null,"code":null}}"#);
                out.extend_from_slice(b"\n\ndata: [DONE]\n\n");
            }
            Wire::OpenAiResponses => {
                self.responses_event_head("error", out);
                out.extend_from_slice(br#","code":"server_error","message":"#);
                push_json_str(out, message, false);
                out.extend_from_slice(br#","param":null}"#);
                out.extend_from_slice(b"\n\n");
                self.responses_event_head("response.failed", out);
                out.extend_from_slice(br#","response":"#);
                self.responses_object_with_error(message, out);
                out.extend_from_slice(b"}\n\n");
            }
            Wire::Anthropic => {
                out.extend_from_slice(
                    br#"event: error
data: {"type":"error","error":{"type":"api_error","message":"#,
                );
                push_json_str(out, message, false);
                out.extend_from_slice(b"}}\n\n");
            }
            Wire::OllamaChat | Wire::OllamaGenerate => {
                out.extend_from_slice(br#"{"error":"#);
                push_json_str(out, message, true);
                out.extend_from_slice(b"}\n");
            }
            Wire::BedrockConverse | Wire::BedrockInvokeAnthropic => {
                let mut json = std::mem::take(&mut self.scratch);
                json.clear();
                json.extend_from_slice(br#"{"message":"#);
                push_json_str(&mut json, message, false);
                json.extend_from_slice(br#","originalStatusCode":500,"originalMessage":"#);
                push_json_str(&mut json, message, false);
                json.push(b'}');
                bedrock_exception_frame("modelStreamErrorException", &json, out);
                self.scratch = json;
            }
        }
    }

    /// The whole answer as one JSON body, for requests with `stream: false`.
    /// Returns the content type. Bedrock wires always stream; for them this writes the
    /// Converse/Messages JSON anyway (what `/converse` and `/invoke` would answer).
    pub fn non_streamed(
        &mut self,
        text: &str,
        finish: Finish,
        output_tokens: u64,
        out: &mut Vec<u8>,
    ) -> &'static str {
        let input = self.params.input_tokens;
        let p = &self.params;
        match self.wire {
            Wire::OpenAiChat => {
                out.extend_from_slice(br#"{"id":"chatcmpl-"#);
                push_json_str_body(out, &p.id, false);
                out.extend_from_slice(br#"","object":"chat.completion","created":"#);
                push_u64(out, p.created_unix_ms / 1000);
                out.extend_from_slice(br#","model":"#);
                push_json_str(out, &p.model, false);
                out.extend_from_slice(
                    br#","choices":[{"index":0,"message":{"role":"assistant","content":"#,
                );
                push_json_str(out, text, false);
                out.extend_from_slice(br#","refusal":null},"logprobs":null,"finish_reason":"#);
                push_json_str(out, openai_finish(finish), false);
                out.extend_from_slice(b"}]");
                push_openai_usage(out, p.usage, input, output_tokens);
                out.extend_from_slice(br#","system_fingerprint":"#);
                push_json_str(out, &p.system_fingerprint, false);
                out.push(b'}');
                "application/json"
            }
            Wire::OpenAiCompletions => {
                out.extend_from_slice(br#"{"id":"cmpl-"#);
                push_json_str_body(out, &p.id, false);
                out.extend_from_slice(br#"","object":"text_completion","created":"#);
                push_u64(out, p.created_unix_ms / 1000);
                out.extend_from_slice(br#","model":"#);
                push_json_str(out, &p.model, false);
                out.extend_from_slice(br#","choices":[{"text":"#);
                push_json_str(out, text, false);
                out.extend_from_slice(br#","index":0,"logprobs":null,"finish_reason":"#);
                push_json_str(out, openai_finish(finish), false);
                out.extend_from_slice(b"}]");
                push_openai_usage(out, p.usage, input, output_tokens);
                out.push(b'}');
                "application/json"
            }
            Wire::OpenAiResponses => {
                self.text.clear();
                self.text.push_str(text);
                let usage = self.params.usage.then_some((input, output_tokens));
                self.responses_object("completed", usage, true, out);
                "application/json"
            }
            Wire::Anthropic | Wire::BedrockInvokeAnthropic => {
                out.extend_from_slice(br#"{"id":"msg_"#);
                push_json_str_body(out, &p.id, false);
                out.extend_from_slice(br#"","type":"message","role":"assistant","model":"#);
                push_json_str(out, &p.model, false);
                out.extend_from_slice(br#","content":[{"type":"text","text":"#);
                push_json_str(out, text, false);
                out.extend_from_slice(br#"}],"stop_reason":"#);
                push_json_str(out, anthropic_finish(finish), false);
                out.extend_from_slice(br#","stop_sequence":null,"usage":{"input_tokens":"#);
                push_u64(out, input);
                out.extend_from_slice(br#","output_tokens":"#);
                push_u64(out, output_tokens);
                out.extend_from_slice(b"}}");
                "application/json"
            }
            Wire::OllamaChat | Wire::OllamaGenerate => {
                self.ollama_head(out);
                if self.wire == Wire::OllamaChat {
                    out.extend_from_slice(br#","message":{"role":"assistant","content":"#);
                    push_json_str(out, text, true);
                    out.push(b'}');
                } else {
                    out.extend_from_slice(br#","response":"#);
                    push_json_str(out, text, true);
                }
                out.extend_from_slice(br#","done":true,"done_reason":"#);
                push_json_str(out, openai_finish(finish), false);
                self.ollama_metrics(output_tokens, out);
                out.push(b'}');
                "application/json; charset=utf-8"
            }
            Wire::BedrockConverse => {
                out.extend_from_slice(
                    br#"{"output":{"message":{"role":"assistant","content":[{"text":"#,
                );
                push_json_str(out, text, false);
                out.extend_from_slice(br#"}]}},"stopReason":"#);
                push_json_str(out, anthropic_finish(finish), false);
                out.extend_from_slice(br#","usage":{"inputTokens":"#);
                push_u64(out, input);
                out.extend_from_slice(br#","outputTokens":"#);
                push_u64(out, output_tokens);
                out.extend_from_slice(br#","totalTokens":"#);
                push_u64(out, input + output_tokens);
                out.extend_from_slice(br#"},"metrics":{"latencyMs":"#);
                push_u64(out, p.timings.total_ns / 1_000_000);
                out.extend_from_slice(b"}}");
                "application/json"
            }
        }
    }

    // --- OpenAI chat / completions ---

    fn chat_chunk_head(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"data: {"id":"chatcmpl-"#);
        push_json_str_body(out, &self.params.id, false);
        out.extend_from_slice(br#"","object":"chat.completion.chunk","created":"#);
        push_u64(out, self.params.created_unix_ms / 1000);
        out.extend_from_slice(br#","model":"#);
        push_json_str(out, &self.params.model, false);
        out.extend_from_slice(br#","service_tier":"default","system_fingerprint":"#);
        push_json_str(out, &self.params.system_fingerprint, false);
        out.push(b',');
    }

    fn chat_chunk_tail(&self, out: &mut Vec<u8>) {
        if self.params.usage {
            out.extend_from_slice(br#","usage":null"#);
        }
        out.extend_from_slice(b"}\n\n");
    }

    fn completions_chunk_head(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"data: {"id":"cmpl-"#);
        push_json_str_body(out, &self.params.id, false);
        out.extend_from_slice(br#"","object":"text_completion","created":"#);
        push_u64(out, self.params.created_unix_ms / 1000);
        out.extend_from_slice(br#","model":"#);
        push_json_str(out, &self.params.model, false);
        out.push(b',');
    }

    /// The rest of an OpenAI usage chunk after its head: empty `choices`, the usage (chat's
    /// with its details), llama.cpp's `timings` when asked for, the end of the event.
    fn openai_usage_chunk_rest(&self, chat: bool, output_tokens: u64, out: &mut Vec<u8>) {
        let input = self.params.input_tokens;
        out.extend_from_slice(br#""choices":[],"usage":{"prompt_tokens":"#);
        push_u64(out, input);
        out.extend_from_slice(br#","completion_tokens":"#);
        push_u64(out, output_tokens);
        out.extend_from_slice(br#","total_tokens":"#);
        push_u64(out, input + output_tokens);
        if chat {
            out.extend_from_slice(
                br#","prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}"#,
            );
        }
        out.push(b'}');
        self.push_llama_timings(output_tokens, out);
        out.extend_from_slice(b"}\n\n");
    }

    /// `,"timings":{...}` as llama.cpp's `result_timings::to_json` writes it (nothing unless
    /// [`StreamEncoder::with_llama_timings`]): every prompt token evaluated, none cached.
    fn push_llama_timings(&self, output_tokens: u64, out: &mut Vec<u8>) {
        if !self.llama_timings {
            return;
        }
        let t = self.params.timings;
        let prompt_ms = t.prompt_eval_ns as f64 / 1e6;
        let predicted_ms = t.eval_ns as f64 / 1e6;
        let per = |ms: f64, n: u64| if n == 0 { 0.0 } else { ms / n as f64 };
        let rate = |ms: f64, n: u64| if ms > 0.0 { 1e3 * n as f64 / ms } else { 0.0 };
        let input = self.params.input_tokens;
        let json = format!(
            r#","timings":{{"cache_n":0,"prompt_n":{input},"prompt_ms":{prompt_ms:.3},"prompt_per_token_ms":{:.3},"prompt_per_second":{:.3},"predicted_n":{output_tokens},"predicted_ms":{predicted_ms:.3},"predicted_per_token_ms":{:.3},"predicted_per_second":{:.3}}}"#,
            per(prompt_ms, input),
            rate(prompt_ms, input),
            per(predicted_ms, output_tokens),
            rate(predicted_ms, output_tokens),
        );
        out.extend_from_slice(json.as_bytes());
    }

    fn completions_chunk_tail(&self, out: &mut Vec<u8>) {
        self.chat_chunk_tail(out);
    }

    // --- OpenAI Responses ---

    /// `event: KIND\ndata: {"type":"KIND","sequence_number":N` (the caller closes the object).
    fn responses_event_head(&mut self, kind: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: {\"type\":\"");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\",\"sequence_number\":");
        push_u64(out, self.sequence);
        self.sequence += 1;
    }

    fn push_msg_item_id(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"\"msg_");
        push_json_str_body(out, &self.params.id, false);
        out.push(b'"');
    }

    fn responses_item_ref(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#","item_id":"#);
        self.push_msg_item_id(out);
        out.extend_from_slice(br#","output_index":0,"content_index":0"#);
    }

    fn push_message_item(&self, text: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"id":"#);
        self.push_msg_item_id(out);
        out.extend_from_slice(br#","type":"message","status":"completed","content":["#);
        push_output_text_part(out, text);
        out.extend_from_slice(br#"],"role":"assistant"}"#);
    }

    /// The `response` object. `with_output` puts the message item (with `self.text`) in
    /// `output`; `usage` is `(input, output)` or `null`.
    fn responses_object(
        &self,
        status: &str,
        usage: Option<(u64, u64)>,
        with_output: bool,
        out: &mut Vec<u8>,
    ) {
        self.responses_object_head(status, out);
        out.extend_from_slice(br#","error":null"#);
        self.responses_object_rest(usage, with_output, out);
    }

    fn responses_object_with_error(&self, message: &str, out: &mut Vec<u8>) {
        self.responses_object_head("failed", out);
        out.extend_from_slice(br#","error":{"code":"server_error","message":"#);
        push_json_str(out, message, false);
        out.push(b'}');
        self.responses_object_rest(None, false, out);
    }

    fn responses_object_head(&self, status: &str, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"id":"resp_"#);
        push_json_str_body(out, &self.params.id, false);
        out.extend_from_slice(br#"","object":"response","created_at":"#);
        push_u64(out, self.params.created_unix_ms / 1000);
        out.extend_from_slice(br#","status":"#);
        push_json_str(out, status, false);
        out.extend_from_slice(br#","background":false"#);
    }

    fn responses_object_rest(
        &self,
        usage: Option<(u64, u64)>,
        with_output: bool,
        out: &mut Vec<u8>,
    ) {
        out.extend_from_slice(
            br#","incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"#,
        );
        push_json_str(out, &self.params.model, false);
        out.extend_from_slice(br#","output":["#);
        if with_output {
            self.push_message_item(&self.text, out);
        }
        out.extend_from_slice(
            br#"],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":"#,
        );
        match usage {
            Some((input, output)) => {
                out.extend_from_slice(br#"{"input_tokens":"#);
                push_u64(out, input);
                out.extend_from_slice(
                    br#","input_tokens_details":{"cached_tokens":0},"output_tokens":"#,
                );
                push_u64(out, output);
                out.extend_from_slice(
                    br#","output_tokens_details":{"reasoning_tokens":0},"total_tokens":"#,
                );
                push_u64(out, input + output);
                out.push(b'}');
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(br#","user":null,"metadata":{}}"#);
    }

    // --- Anthropic (SSE, or wrapped in Bedrock `chunk` frames) ---

    fn anthropic_event(&self, name: &str, json: &[u8], out: &mut Vec<u8>) {
        if self.wire == Wire::BedrockInvokeAnthropic {
            bedrock_chunk_frame(json, None, out);
        } else {
            out.extend_from_slice(b"event: ");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\ndata: ");
            out.extend_from_slice(json);
            out.extend_from_slice(b"\n\n");
        }
    }

    // --- Ollama ---

    fn ollama_head(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(br#"{"model":"#);
        push_json_str(out, &self.params.model, true);
        out.extend_from_slice(br#","created_at":"#);
        push_json_str(out, &self.created_at, true);
    }

    fn ollama_metrics(&self, output_tokens: u64, out: &mut Vec<u8>) {
        let t = self.params.timings;
        // Go's `omitempty`: a zero metric is absent from the wire.
        let field = |name: &[u8], value: u64, out: &mut Vec<u8>| {
            if value != 0 {
                out.extend_from_slice(b",\"");
                out.extend_from_slice(name);
                out.extend_from_slice(b"\":");
                push_u64(out, value);
            }
        };
        field(b"total_duration", t.total_ns, out);
        field(b"load_duration", t.load_ns, out);
        if self.params.usage {
            field(b"prompt_eval_count", self.params.input_tokens, out);
            field(b"prompt_eval_duration", t.prompt_eval_ns, out);
            field(b"eval_count", output_tokens, out);
            field(b"eval_duration", t.eval_ns, out);
        }
    }
}

/// An HTTP error response in a family's shape (written before any streaming).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// HTTP status code.
    pub status: u16,
    /// `Content-Type` of `body`.
    pub content_type: &'static str,
    /// Extra headers the family's clients read (Bedrock's `x-amzn-errortype`, lower case as HTTP/2 requires).
    pub headers: Vec<(&'static str, String)>,
    /// The JSON body.
    pub body: Vec<u8>,
}

/// An HTTP error body in `wire`'s shape, for `status` with `message`:
/// OpenAI `{"error":{"message","type","param","code"}}`, Anthropic
/// `{"type":"error","error":{"type","message"}}`, Ollama `{"error":"…"}`, Bedrock
/// `{"message":"…"}` plus `x-amzn-errortype`.
pub fn http_error(wire: Wire, status: u16, message: &str) -> HttpError {
    let mut body = Vec::with_capacity(128 + message.len());
    let mut headers = Vec::new();
    match wire.family() {
        Family::OpenAiChat | Family::OpenAiCompletions | Family::OpenAiResponses => {
            let kind = match status {
                400 | 404 | 405 | 413 | 422 => "invalid_request_error",
                401 => "authentication_error",
                403 => "permission_error",
                429 => "rate_limit_error",
                _ => "server_error",
            };
            body.extend_from_slice(br#"{"error":{"message":"#);
            push_json_str(&mut body, message, false);
            body.extend_from_slice(br#","type":"#);
            push_json_str(&mut body, kind, false);
            body.extend_from_slice(br#","param":null,"code":null}}"#);
        }
        Family::Anthropic => {
            let kind = match status {
                400 | 405 | 413 | 422 => "invalid_request_error",
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            };
            body.extend_from_slice(br#"{"type":"error","error":{"type":"#);
            push_json_str(&mut body, kind, false);
            body.extend_from_slice(br#","message":"#);
            push_json_str(&mut body, message, false);
            body.extend_from_slice(b"}}");
        }
        Family::Ollama => {
            body.extend_from_slice(br#"{"error":"#);
            push_json_str(&mut body, message, true);
            body.push(b'}');
        }
        Family::BedrockConverse | Family::BedrockInvoke => {
            let kind = match status {
                400 | 413 | 422 => "ValidationException",
                403 => "AccessDeniedException",
                404 => "ResourceNotFoundException",
                408 => "ModelTimeoutException",
                424 => "ModelStreamErrorException",
                429 => "ThrottlingException",
                503 => "ServiceUnavailableException",
                _ => "InternalServerException",
            };
            headers.push(("x-amzn-errortype", format!("{kind}:")));
            body.extend_from_slice(br#"{"message":"#);
            push_json_str(&mut body, message, false);
            body.push(b'}');
        }
    }
    HttpError {
        status,
        content_type: "application/json",
        headers,
        body,
    }
}

/// One Bedrock event frame: `:event-type` = `event_type`, JSON `payload`, header order as
/// observed on the real service (`:event-type`, `:content-type`, `:message-type`).
pub fn bedrock_event_frame(event_type: &str, payload: &[u8], out: &mut Vec<u8>) {
    bedrock_frame((":event-type", event_type), "event", payload, out);
}

/// One Bedrock exception frame (`:message-type: exception`), e.g. `throttlingException` or
/// `modelStreamErrorException`, with a JSON `payload` such as `{"message":"…"}`.
pub fn bedrock_exception_frame(exception_type: &str, payload: &[u8], out: &mut Vec<u8>) {
    bedrock_frame(
        (":exception-type", exception_type),
        "exception",
        payload,
        out,
    );
}

/// A Bedrock frame with its type header, `:content-type: application/json` and
/// `:message-type`, in the service's header order.
fn bedrock_frame(kind: (&str, &str), message_type: &str, payload: &[u8], out: &mut Vec<u8>) {
    let string = |value: &str| HeaderValue::String(value.to_owned().into());
    let message = Message::new(bytes::Bytes::copy_from_slice(payload))
        .add_header(Header::new(kind.0.to_owned(), string(kind.1)))
        .add_header(Header::new(":content-type", string("application/json")))
        .add_header(Header::new(":message-type", string(message_type)));
    write_frame(&message, out);
}

/// One InvokeModelWithResponseStream `chunk` frame whose payload is
/// `{"bytes":"<base64 of inner>"}` (plus the `p` padding field when given).
pub fn bedrock_chunk_frame(inner: &[u8], padding: Option<&str>, out: &mut Vec<u8>) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut payload = Vec::with_capacity(16 + inner.len() * 4 / 3 + 4);
    payload.extend_from_slice(br#"{"bytes":""#);
    let start = payload.len();
    payload.resize(
        start + base64::encoded_len(inner.len(), true).unwrap_or(0),
        0,
    );
    let written = b64
        .encode_slice(inner, &mut payload[start..])
        .unwrap_or_default();
    payload.truncate(start + written);
    payload.push(b'"');
    if let Some(p) = padding {
        payload.extend_from_slice(br#","p":"#);
        push_json_str(&mut payload, p, false);
    }
    payload.push(b'}');
    bedrock_event_frame("chunk", &payload, out);
}

fn write_frame(message: &Message, out: &mut Vec<u8>) {
    let before = out.len();
    // Fails only for a payload over 4 GiB or over-long headers, neither of which the mock
    // builds; on failure nothing (not half a frame) is left behind.
    if aws_smithy_eventstream::frame::write_message_to(message, out).is_err() {
        out.truncate(before);
    }
}

/// Go-style RFC 3339 UTC time with nanosecond precision and trailing zeros trimmed
/// (`2025-10-26T17:15:24.09776Z`), as Ollama writes `created_at`.
pub fn rfc3339_from_unix_ms(unix_ms: u64) -> String {
    let mut s = crate::civil::utc_date_time(unix_ms / 1000);
    let millis = unix_ms % 1000;
    if millis != 0 {
        let frac = format!("{millis:03}");
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push('Z');
    s
}

fn openai_finish(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

fn anthropic_finish(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "end_turn",
        Finish::Length => "max_tokens",
    }
}

fn push_openai_usage(out: &mut Vec<u8>, on: bool, input: u64, output: u64) {
    if on {
        out.extend_from_slice(br#","usage":{"prompt_tokens":"#);
        push_u64(out, input);
        out.extend_from_slice(br#","completion_tokens":"#);
        push_u64(out, output);
        out.extend_from_slice(br#","total_tokens":"#);
        push_u64(out, input + output);
        out.push(b'}');
    }
}

fn push_output_text_part(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(br#"{"type":"output_text","annotations":[],"logprobs":[],"text":"#);
    push_json_str(out, text, false);
    out.push(b'}');
}

/// Decimal digits of `n`, without allocating.
fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// `s` as a quoted JSON string.
fn push_json_str(out: &mut Vec<u8>, s: &str, go_html_escape: bool) {
    out.push(b'"');
    push_json_str_body(out, s, go_html_escape);
    out.push(b'"');
}

/// `s` JSON-escaped without quotes. `go_html_escape` also escapes `<`, `>`, `&` as Go's
/// `encoding/json` does (Ollama's wire bytes).
fn push_json_str_body(out: &mut Vec<u8>, s: &str, go_html_escape: bool) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            b'\n' => Some(b"\\n"),
            b'\r' => Some(b"\\r"),
            b'\t' => Some(b"\\t"),
            0..=0x1f => Some(b""),
            b'<' | b'>' | b'&' if go_html_escape => Some(b""),
            _ => None,
        };
        if let Some(esc) = escape {
            out.extend_from_slice(&bytes[start..i]);
            if esc.is_empty() {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
            } else {
                out.extend_from_slice(esc);
            }
            start = i + 1;
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(id: &str, model: &str, input: u64, usage: bool) -> StreamParams {
        StreamParams {
            id: id.to_owned(),
            model: model.to_owned(),
            created_unix_ms: 1_735_689_600_000,
            input_tokens: input,
            usage,
            system_fingerprint: "fp_0aa8d3e20b".to_owned(),
            timings: ServerTimings::default(),
        }
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// §2.3 literal, with the random `obfuscation` padding removed.
    #[test]
    fn openai_chat_matches_reference_literal() {
        let expected = concat!(
            r#"data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1735689600,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0aa8d3e20b","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            "\n\n",
            r#"data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1735689600,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0aa8d3e20b","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            "\n\n",
            r#"data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1735689600,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0aa8d3e20b","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            "\n\n",
            r#"data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1735689600,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0aa8d3e20b","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}"#,
            "\n\n",
            r#"data: {"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1735689600,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0aa8d3e20b","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}"#,
            "\n\n",
            "data: [DONE]\n\n",
        );
        let mut enc = StreamEncoder::new(
            Wire::OpenAiChat,
            params("abc123", "gpt-4o-mini-2024-07-18", 9, true),
        );
        let mut out = Vec::new();
        enc.preamble(&mut out);
        enc.token("Hello", None, &mut out);
        enc.token(" world", None, &mut out);
        enc.finish(Finish::Stop, 2, &mut out);
        assert_eq!(String::from_utf8_lossy(&out), expected);
    }

    #[test]
    fn openai_chat_usage_off_has_no_usage_anywhere() {
        let mut enc = StreamEncoder::new(Wire::OpenAiChat, params("x", "m", 9, false));
        let mut out = Vec::new();
        enc.preamble(&mut out);
        enc.token("a", None, &mut out);
        enc.finish(Finish::Stop, 1, &mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains("usage"), "{text}");
        assert!(text.ends_with("\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"));
    }

    /// §2.6 literal, byte for byte.
    #[test]
    fn openai_completions_matches_reference_literal() {
        let expected = concat!(
            r#"data: {"id":"cmpl-xyz","object":"text_completion","created":1735689600,"model":"gpt-3.5-turbo-instruct","choices":[{"text":"Hello","index":0,"logprobs":null,"finish_reason":null}],"usage":null}"#,
            "\n\n",
            r#"data: {"id":"cmpl-xyz","object":"text_completion","created":1735689600,"model":"gpt-3.5-turbo-instruct","choices":[{"text":" world","index":0,"logprobs":null,"finish_reason":"length"}],"usage":null}"#,
            "\n\n",
            r#"data: {"id":"cmpl-xyz","object":"text_completion","created":1735689600,"model":"gpt-3.5-turbo-instruct","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#,
            "\n\n",
            "data: [DONE]\n\n",
        );
        let mut enc = StreamEncoder::new(
            Wire::OpenAiCompletions,
            params("xyz", "gpt-3.5-turbo-instruct", 3, true),
        );
        let mut out = Vec::new();
        enc.preamble(&mut out);
        enc.token("Hello", None, &mut out);
        enc.token(" world", Some(Finish::Length), &mut out);
        enc.finish(Finish::Length, 2, &mut out);
        assert_eq!(String::from_utf8_lossy(&out), expected);
    }

    /// §3.2 literal, byte for byte (ping included where the reference has it).
    #[test]
    fn anthropic_matches_reference_literal() {
        let expected = concat!(
            "event: message_start\n",
            r#"data: {"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1,"service_tier":"standard"}}}"#,
            "\n\nevent: content_block_start\n",
            r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            "\n\nevent: ping\n",
            r#"data: {"type": "ping"}"#,
            "\n\nevent: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
            "\n\nevent: content_block_delta\n",
            r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world"}}"#,
            "\n\nevent: content_block_stop\n",
            r#"data: {"type":"content_block_stop","index":0}"#,
            "\n\nevent: message_delta\n",
            r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#,
            "\n\nevent: message_stop\n",
            r#"data: {"type":"message_stop"}"#,
            "\n\n",
        );
        let mut enc = StreamEncoder::new(
            Wire::Anthropic,
            params(
                "01XFDUDYJgAACzvnptvVoYEL",
                "claude-sonnet-4-5-20250929",
                25,
                true,
            ),
        );
        let mut out = Vec::new();
        enc.preamble(&mut out);
        enc.ping(&mut out);
        enc.token("Hello", None, &mut out);
        enc.token(" world", None, &mut out);
        enc.finish(Finish::Stop, 15, &mut out);
        assert_eq!(String::from_utf8_lossy(&out), expected);
    }

    /// §5.2 `/api/chat` literal, byte for byte.
    #[test]
    fn ollama_chat_matches_reference_literal() {
        let expected = concat!(
            r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00.000000001Z","message":{"role":"assistant","content":"Hello"},"done":false}"#,
            "\n",
            r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00.012345678Z","message":{"role":"assistant","content":" world"},"done":false}"#,
            "\n",
            r#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00.024691356Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":174560334,"load_duration":101397084,"prompt_eval_count":11,"prompt_eval_duration":13074791,"eval_count":18,"eval_duration":52479709}"#,
            "\n",
        );
        let mut p = params("x", "llama3.2", 11, true);
        p.timings = ServerTimings {
            total_ns: 174_560_334,
            load_ns: 101_397_084,
            prompt_eval_ns: 13_074_791,
            eval_ns: 52_479_709,
        };
        let mut enc = StreamEncoder::new(Wire::OllamaChat, p);
        let mut out = Vec::new();
        enc.preamble(&mut out);
        enc.set_created_at("2025-01-01T00:00:00.000000001Z");
        enc.token("Hello", None, &mut out);
        enc.set_created_at("2025-01-01T00:00:00.012345678Z");
        enc.token(" world", None, &mut out);
        enc.set_created_at("2025-01-01T00:00:00.024691356Z");
        enc.finish(Finish::Stop, 18, &mut out);
        assert_eq!(String::from_utf8_lossy(&out), expected);
    }

    #[test]
    fn ollama_escapes_html_like_go_and_usage_off_drops_counts() {
        let mut enc = StreamEncoder::new(Wire::OllamaGenerate, params("x", "m", 11, false));
        let mut out = Vec::new();
        enc.token("<think>&", None, &mut out);
        enc.finish(Finish::Length, 1, &mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.contains(r#""response":"\u003cthink\u003e\u0026""#),
            "{text}"
        );
        assert!(
            text.contains(r#""done":true,"done_reason":"length""#),
            "{text}"
        );
        assert!(!text.contains("eval_count"), "{text}");
        assert!(!text.contains("\n\n"), "no blank lines: {text}");
    }

    /// §4.3 annotated frame, byte for byte.
    #[test]
    fn bedrock_delta_frame_matches_reference_hex() {
        let mut enc = StreamEncoder::new(Wire::BedrockConverse, params("x", "m", 9, true));
        let mut out = Vec::new();
        enc.token("Hi", None, &mut out);
        assert_eq!(
            hex(&out),
            "0000009400000057b4ab9aee0b3a6576656e742d74797065070011636f6e74656e74426c6f636b44656c74610d3a636f6e74656e742d747970650700106170706c69636174696f6e2f6a736f6e0d3a6d6573736167652d747970650700056576656e747b22636f6e74656e74426c6f636b496e646578223a302c2264656c7461223a7b2274657874223a224869227d7d1f944657"
        );
    }

    /// §4.3 throttling exception frame, byte for byte.
    #[test]
    fn bedrock_exception_frame_matches_reference_hex() {
        let mut out = Vec::new();
        bedrock_exception_frame(
            "throttlingException",
            br#"{"message":"Too many requests, please wait before trying again."}"#,
            &mut out,
        );
        assert_eq!(
            hex(&out),
            "000000b2000000613590d5d30f3a657863657074696f6e2d747970650700137468726f74746c696e67457863657074696f6e0d3a636f6e74656e742d747970650700106170706c69636174696f6e2f6a736f6e0d3a6d6573736167652d74797065070009657863657074696f6e7b226d657373616765223a22546f6f206d616e792072657175657374732c20706c656173652077616974206265666f726520747279696e6720616761696e2e227de8ffb26a"
        );
    }

    /// §4.5 literal chunk frame: prelude and message CRC as in the reference.
    #[test]
    fn bedrock_chunk_frame_matches_reference() {
        let mut out = Vec::new();
        bedrock_chunk_frame(
            br#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
            Some("abcdefgh"),
            &mut out,
        );
        assert_eq!(hex(&out[..12]), "000000e60000004b23b8750e");
        assert_eq!(hex(&out[out.len() - 4..]), "8ec56ae9");
        let payload = &out[12 + 0x4b..out.len() - 4];
        assert_eq!(
            payload,
            br#"{"bytes":"eyJ0eXBlIjoiY29udGVudF9ibG9ja19kZWx0YSIsImluZGV4IjowLCJkZWx0YSI6eyJ0eXBlIjoidGV4dF9kZWx0YSIsInRleHQiOiJIaSJ9fQ==","p":"abcdefgh"}"#
        );
    }

    /// Decode every event-stream frame of `bytes` (headers as strings, payload).
    type DecodedFrame = (Vec<(String, String)>, Vec<u8>);

    fn decode_frames(bytes: &[u8]) -> Vec<DecodedFrame> {
        let mut buf = bytes::BytesMut::from(bytes);
        let mut decoder = aws_smithy_eventstream::frame::MessageFrameDecoder::new();
        let mut frames = Vec::new();
        while let aws_smithy_eventstream::frame::DecodedFrame::Complete(m) =
            decoder.decode_frame(&mut buf).expect("valid frames")
        {
            let headers = m
                .headers()
                .iter()
                .map(|h| {
                    (
                        h.name().as_str().to_owned(),
                        h.value()
                            .as_string()
                            .expect("string header")
                            .as_str()
                            .to_owned(),
                    )
                })
                .collect();
            frames.push((headers, m.payload().to_vec()));
        }
        assert!(buf.is_empty());
        frames
    }

    #[test]
    fn bedrock_converse_full_stream_order_and_usage() {
        let mut enc = StreamEncoder::new(Wire::BedrockConverse, params("x", "m", 9, true));
        let mut out = Vec::new();
        enc.preamble(&mut out);
        enc.token("Hello", None, &mut out);
        enc.token(" world", None, &mut out);
        enc.finish(Finish::Stop, 2, &mut out);
        let frames = decode_frames(&out);
        let types: Vec<&str> = frames.iter().map(|(h, _)| h[0].1.as_str()).collect();
        assert_eq!(
            types,
            [
                "messageStart",
                "contentBlockDelta",
                "contentBlockDelta",
                "contentBlockStop",
                "messageStop",
                "metadata"
            ]
        );
        let metadata: serde_json::Value =
            serde_json::from_slice(&frames[5].1).expect("metadata json");
        assert_eq!(metadata["usage"]["outputTokens"], 2);
        assert_eq!(metadata["usage"]["inputTokens"], 9);
    }

    #[test]
    fn bedrock_invoke_wraps_anthropic_events_with_metrics() {
        let mut enc = StreamEncoder::new(Wire::BedrockInvokeAnthropic, params("x", "m", 9, true));
        let mut out = Vec::new();
        enc.preamble(&mut out);
        enc.token("Hi", None, &mut out);
        enc.finish(Finish::Stop, 1, &mut out);
        let inner: Vec<serde_json::Value> = decode_frames(&out)
            .into_iter()
            .map(|(headers, payload)| {
                assert_eq!(headers[0], (":event-type".into(), "chunk".into()));
                let outer: serde_json::Value = serde_json::from_slice(&payload).expect("json");
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(outer["bytes"].as_str().expect("bytes"))
                    .expect("base64");
                serde_json::from_slice(&raw).expect("inner json")
            })
            .collect();
        let types: Vec<&str> = inner
            .iter()
            .map(|v| v["type"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(
            types,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(
            inner[5]["amazon-bedrock-invocationMetrics"]["outputTokenCount"],
            1
        );
    }

    #[test]
    fn responses_lifecycle_is_consistent() {
        let mut enc = StreamEncoder::new(Wire::OpenAiResponses, params("r1", "m", 9, true));
        let mut out = Vec::new();
        enc.preamble(&mut out);
        enc.token("Hello", None, &mut out);
        enc.token(" world", None, &mut out);
        enc.finish(Finish::Stop, 2, &mut out);
        let text = String::from_utf8(out).expect("utf8");
        let mut events = Vec::new();
        for block in text.split_terminator("\n\n") {
            let (event, data) = block.split_once('\n').expect("event and data lines");
            let name = event.strip_prefix("event: ").expect("event line");
            let json: serde_json::Value =
                serde_json::from_str(data.strip_prefix("data: ").expect("data")).expect("json");
            assert_eq!(json["type"], name);
            events.push(json);
        }
        assert_eq!(events.len(), 10);
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e["sequence_number"], i as u64);
        }
        assert_eq!(events[0]["response"]["id"], "resp_r1");
        assert_eq!(events[9]["type"], "response.completed");
        assert_eq!(events[9]["response"]["id"], "resp_r1");
        assert_eq!(events[9]["response"]["usage"]["output_tokens"], 2);
        assert_eq!(
            events[9]["response"]["output"][0]["content"][0]["text"],
            "Hello world"
        );
        assert_eq!(events[2]["item"]["id"], events[8]["item"]["id"]);
    }

    #[test]
    fn error_frames_per_family() {
        let cases = [
            (
                Wire::OpenAiChat,
                "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\ndata: [DONE]\n\n",
            ),
            (
                Wire::Anthropic,
                "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}\n\n",
            ),
            (Wire::OllamaChat, "{\"error\":\"boom\"}\n"),
        ];
        for (wire, expected) in cases {
            let mut enc = StreamEncoder::new(wire, params("x", "m", 1, true));
            let mut out = Vec::new();
            enc.error_frame("boom", &mut out);
            assert_eq!(String::from_utf8_lossy(&out), expected, "{wire:?}");
        }
        let mut enc = StreamEncoder::new(Wire::BedrockConverse, params("x", "m", 1, true));
        let mut out = Vec::new();
        enc.error_frame("boom", &mut out);
        let frames = decode_frames(&out);
        assert_eq!(
            frames[0].0[0],
            (":exception-type".into(), "modelStreamErrorException".into())
        );
        assert_eq!(frames[0].0[2], (":message-type".into(), "exception".into()));
        let mut enc = StreamEncoder::new(Wire::OpenAiResponses, params("x", "m", 1, true));
        let mut out = Vec::new();
        enc.error_frame("boom", &mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.starts_with("event: error\ndata: {\"type\":\"error\""),
            "{text}"
        );
        assert!(text.contains("event: response.failed\n"), "{text}");
    }

    #[test]
    fn http_errors_have_family_shapes() {
        let e = http_error(Wire::OpenAiChat, 500, "x");
        let v: serde_json::Value = serde_json::from_slice(&e.body).expect("json");
        assert_eq!(v["error"]["type"], "server_error");
        let e = http_error(Wire::Anthropic, 429, "x");
        let v: serde_json::Value = serde_json::from_slice(&e.body).expect("json");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        let e = http_error(Wire::OllamaGenerate, 500, "x");
        assert_eq!(e.body, br#"{"error":"x"}"#);
        let e = http_error(Wire::BedrockConverse, 429, "x");
        assert_eq!(e.headers[0].1, "ThrottlingException:");
        assert_eq!(e.body, br#"{"message":"x"}"#);
    }

    #[test]
    fn non_streamed_bodies_are_json() {
        for wire in [
            Wire::OpenAiChat,
            Wire::OpenAiCompletions,
            Wire::OpenAiResponses,
            Wire::Anthropic,
            Wire::OllamaChat,
            Wire::OllamaGenerate,
            Wire::BedrockConverse,
        ] {
            let mut enc = StreamEncoder::new(wire, params("x", "m\"<", 1, true));
            let mut out = Vec::new();
            enc.non_streamed("a \"quoted\"\n<text>", Finish::Stop, 3, &mut out);
            let v: serde_json::Value = serde_json::from_slice(&out).expect("valid json");
            assert!(
                v.to_string().contains("a \\\"quoted\\\"\\n<text>"),
                "{wire:?}: {v}"
            );
        }
    }

    #[test]
    fn rfc3339_formats_like_go() {
        assert_eq!(
            rfc3339_from_unix_ms(1_735_689_600_000),
            "2025-01-01T00:00:00Z"
        );
        assert_eq!(
            rfc3339_from_unix_ms(1_761_498_924_090),
            "2025-10-26T17:15:24.09Z"
        );
        assert_eq!(
            rfc3339_from_unix_ms(951_782_400_000),
            "2000-02-29T00:00:00Z"
        );
    }

    #[test]
    fn wire_from_path() {
        assert_eq!(
            Wire::from_path("/model/a%3A0/converse-stream"),
            Some(Wire::BedrockConverse)
        );
        assert_eq!(Wire::from_path("/v1/messages"), Some(Wire::Anthropic));
        assert_eq!(Wire::from_path("/v2/x"), None);
        // The one path table: prefixes (Azure deployments, gateway mounts) and queries too.
        assert_eq!(
            Wire::from_path("/openai/deployments/d/chat/completions?api-version=1"),
            Some(Wire::OpenAiChat)
        );
        assert_eq!(Wire::from_path("/ollama/api/chat"), Some(Wire::OllamaChat));
        assert_eq!(
            Wire::from_path("/api/generate/"),
            Some(Wire::OllamaGenerate)
        );
        assert_eq!(Wire::from_path("/model/m/converse"), None);
        assert_eq!(
            Wire::from_path("/model/m/invoke-with-response-stream"),
            Some(Wire::BedrockInvokeAnthropic)
        );
    }
}
