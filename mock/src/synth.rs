//! Synthetic responses: what a request asks for, and the frame plan that answers it.
//!
//! The whole stream is encoded into one buffer when the request arrives; frames are slices of
//! it, so playing the stream allocates nothing per frame.

use std::time::Duration;

use bytes::Bytes;
use common::formats::encode::{Finish, ServerTimings, StreamEncoder, StreamParams, Wire};
use common::formats::request;
use serde_json::Value;

use super::body::{Ending, PlannedFrame};
use super::tokenized::MockTokenizer;
use crate::metrics::Grouping;

/// Words the synthetic tokens cycle through (one token = one word, the first without its
/// leading space), so clients can check they read every token.
pub const TOKEN_WORDS: &[&str] = &[
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "consectetur",
    "adipiscing",
    "elit",
    "sed",
    "do",
    "eiusmod",
    "tempor",
    "incididunt",
    "ut",
    "labore",
    "et",
];

/// Tokens a request may ask for through its own max-tokens field; more is clamped, so a huge
/// `max_tokens` cannot make the mock pre-encode gigabytes (`--tokens` is not clamped).
pub const MAX_REQUESTED_TOKENS: u64 = 65_536;

/// Tokens when neither `--tokens` nor the request says.
pub const DEFAULT_TOKENS: u64 = 16;

/// The text of synthetic token `i`.
pub fn token_text(i: u64) -> (&'static str, &'static str) {
    let word = TOKEN_WORDS[(i % TOKEN_WORDS.len() as u64) as usize];
    (if i == 0 { "" } else { " " }, word)
}

/// With `--tokenizer`, every `PAIR_EVERY`-th token frame carries two tokens, as llama.cpp's
/// and vLLM's streams sometimes do: counting frames then undercounts the tokens by 1 in 13
/// (≈ 7.7 %), which a client must not mistake for the output length.
pub(crate) const PAIR_EVERY: u64 = 12;

/// The words of synthetic output: [`TOKEN_WORDS`], or `--tokenizer`'s.
#[derive(Clone, Copy)]
pub(crate) enum OutputWords<'a> {
    Lorem,
    Tokenizer(&'a MockTokenizer),
}

impl OutputWords<'_> {
    fn push(self, i: u64, out: &mut String) {
        let (space, word) = match self {
            OutputWords::Lorem => token_text(i),
            OutputWords::Tokenizer(tokenizer) => tokenizer.token(i),
        };
        out.push_str(space);
        out.push_str(word);
    }
}

/// What the mock needs to know from a request body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RequestInfo {
    pub(crate) stream: bool,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) input_tokens: u64,
    pub(crate) model: Option<String>,
    /// OpenAI `stream_options.include_usage`.
    pub(crate) include_usage: bool,
}

/// Parse the JSON body of a request for `wire`. `Err` is a message for a 400 answer.
pub(crate) fn analyze(wire: Wire, body: &[u8]) -> Result<RequestInfo, String> {
    let value: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Default::default())
    } else {
        serde_json::from_slice(body).map_err(|e| format!("request body is not valid JSON: {e}"))?
    };
    let Value::Object(obj) = &value else {
        return Err("request body must be a JSON object".to_owned());
    };
    let flag = request::stream_flag(&value)?;
    // The wire is known from the path already: Bedrock's streaming operations always stream.
    let stream = wire.always_streams() || request::asks_stream(Some(wire.family()), "", flag);
    let max_tokens = request::max_tokens(&value).map(|m| m.value);
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let model = request::model(&value).map(str::to_owned);
    Ok(RequestInfo {
        stream,
        max_tokens,
        input_tokens: request::estimated_input_tokens(&value),
        model,
        include_usage,
    })
}

/// The timing and faults of one synthetic answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SynthSchedule {
    /// Time to first token (including prefill).
    pub(crate) ttft: Duration,
    pub(crate) itl: Duration,
    pub(crate) tokens: u64,
    pub(crate) finish: Finish,
    pub(crate) fault: MidStreamFault,
    /// Pause inserted before the second half of the tokens, if any.
    pub(crate) stall: Option<Duration>,
    pub(crate) grouping: Grouping,
    /// `--usage timings`: llama.cpp's `timings` on the last chunk (OpenAI chat and
    /// completions).
    pub(crate) llama_timings: bool,
}

/// A fault that happens after half the tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MidStreamFault {
    None,
    /// Send the family's error frame, then end the stream.
    ErrorFrame,
    /// Cut the connection (no terminating chunk).
    Drop,
    /// Cut the connection right after the head, at the first token's time: no frame at all
    /// (not even a preamble).
    CutAfterHead,
}

/// A synthetic response plan: either a stream or one JSON body at `offset`.
pub(crate) enum SynthPlan {
    Stream {
        frames: Vec<PlannedFrame>,
        ending: Ending,
        /// Index in `frames` of the frame carrying the first token.
        first_token: usize,
        /// Tokens sent (on the token frames from `first_token` on, as `grouping` puts
        /// them): fewer than asked when a fault cuts in.
        tokens_sent: u64,
    },
    Whole {
        body: Bytes,
        content_type: &'static str,
        offset: Duration,
    },
}

/// Encode the whole answer and plan when each frame goes out.
pub(crate) fn plan(
    wire: Wire,
    params: StreamParams,
    stream: bool,
    schedule: &SynthSchedule,
    words: OutputWords<'_>,
) -> SynthPlan {
    let n = schedule.tokens;
    let token_offset = |i: u64| -> Duration {
        let base = schedule.ttft + schedule.itl.saturating_mul(i.min(u32::MAX as u64) as u32);
        match schedule.stall {
            Some(stall) if i >= n / 2 && i > 0 => base + stall,
            _ => base,
        }
    };
    let last_offset = token_offset(n.saturating_sub(1));
    let mut encoder = StreamEncoder::new(wire, params);
    if schedule.llama_timings {
        encoder = encoder.with_llama_timings();
    }
    if !stream {
        let mut text = String::with_capacity(n as usize * 8);
        for i in 0..n {
            words.push(i, &mut text);
        }
        let mut out = Vec::with_capacity(text.len() + 512);
        let content_type = encoder.non_streamed(&text, schedule.finish, n, &mut out);
        return SynthPlan::Whole {
            body: Bytes::from(out),
            content_type,
            offset: last_offset,
        };
    }
    // Where a mid-stream fault cuts in: after half the tokens.
    let cut = match schedule.fault {
        MidStreamFault::None => None,
        MidStreamFault::CutAfterHead => Some(0),
        _ => Some(n / 2),
    };
    let sent = cut.unwrap_or(n);
    let mut out: Vec<u8> = Vec::with_capacity(512 + sent as usize * 256);
    // (end offset in `out`, time offset) per frame; sliced once `out` is frozen.
    let mut marks: Vec<(usize, Duration)> = Vec::with_capacity(sent as usize + 2);
    if schedule.fault != MidStreamFault::CutAfterHead {
        encoder.preamble(&mut out);
    }
    if !out.is_empty() {
        marks.push((out.len(), Duration::ZERO));
    }
    // The frame that carries token 0 (after the preamble's, if any): the server's TTFT.
    let first_token = marks.len();
    let mut word = String::with_capacity(32);
    let mut i = 0;
    let mut k = 0;
    while i < sent {
        // A frame of several tokens goes out when its last token is due.
        let carried = schedule.grouping.tokens_of(k, sent);
        word.clear();
        for j in i..i + carried {
            words.push(j, &mut word);
        }
        i += carried;
        k += 1;
        let last = cut.is_none() && i == n;
        encoder.token(&word, last.then_some(schedule.finish), &mut out);
        marks.push((out.len(), token_offset(i - 1)));
    }
    let ending = match schedule.fault {
        MidStreamFault::None => {
            encoder.finish(schedule.finish, n, &mut out);
            marks.push((out.len(), if n == 0 { schedule.ttft } else { last_offset }));
            Ending::Clean
        }
        MidStreamFault::ErrorFrame => {
            encoder.error_frame(
                "The server had an error while processing your request (injected by llm-replay mock).",
                &mut out,
            );
            marks.push((out.len(), token_offset(sent)));
            Ending::Clean
        }
        MidStreamFault::Drop | MidStreamFault::CutAfterHead => Ending::Abort(token_offset(sent)),
    };
    let all = Bytes::from(out);
    let mut frames = Vec::with_capacity(marks.len());
    let mut start = 0;
    for (end, offset) in marks {
        if end > start {
            frames.push(PlannedFrame {
                bytes: all.slice(start..end),
                offset,
            });
        }
        start = end;
    }
    SynthPlan::Stream {
        frames,
        ending,
        first_token,
        tokens_sent: sent,
    }
}

/// Server timings to report for a schedule (Ollama durations, Bedrock metrics).
pub(crate) fn timings(schedule: &SynthSchedule) -> ServerTimings {
    let eval = schedule
        .itl
        .saturating_mul(schedule.tokens.saturating_sub(1).min(u32::MAX as u64) as u32);
    let nanos = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
    ServerTimings {
        total_ns: nanos(schedule.ttft + eval),
        load_ns: 0,
        prompt_eval_ns: nanos(schedule.ttft),
        eval_ns: nanos(eval),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analyze_reads_stream_max_tokens_and_input() {
        let info = analyze(
            Wire::OpenAiChat,
            br#"{"model":"m","stream":true,"max_completion_tokens":7,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"abcdefghi"}]}"#,
        )
        .expect("valid");
        assert_eq!(
            info,
            RequestInfo {
                stream: true,
                max_tokens: Some(7),
                input_tokens: 3,
                model: Some("m".into()),
                include_usage: true
            }
        );
        let info = analyze(
            Wire::OllamaChat,
            br#"{"model":"m","options":{"num_predict":-1},"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .expect("valid");
        assert!(info.stream, "ollama streams by default");
        assert_eq!(info.max_tokens, None);
        let info = analyze(
            Wire::BedrockConverse,
            br#"{"inferenceConfig":{"maxTokens":5},"system":[{"text":"1234"}],"messages":[{"role":"user","content":[{"text":"12345"}]}]}"#,
        )
        .expect("valid");
        assert!(info.stream);
        assert_eq!(info.max_tokens, Some(5));
        assert_eq!(info.input_tokens, 3); // 9 chars
        let info = analyze(Wire::Anthropic, br#"{"max_tokens":3,"messages":[]}"#).expect("ok");
        assert!(
            !info.stream,
            "anthropic without stream:true is not streamed"
        );
    }

    #[test]
    fn analyze_rejects_bad_bodies() {
        assert!(analyze(Wire::OpenAiChat, b"{").is_err());
        assert!(analyze(Wire::OpenAiChat, b"[1]").is_err());
        assert!(analyze(Wire::OpenAiChat, br#"{"stream":"yes"}"#).is_err());
    }

    #[test]
    fn plan_schedules_one_frame_per_token_at_absolute_offsets() {
        let schedule = SynthSchedule {
            ttft: Duration::from_millis(200),
            itl: Duration::from_millis(10),
            tokens: 4,
            finish: Finish::Stop,
            fault: MidStreamFault::None,
            stall: Some(Duration::from_millis(50)),
            grouping: Grouping::OnePerFrame,
            llama_timings: false,
        };
        let params = StreamParams {
            id: "1".into(),
            model: "m".into(),
            created_unix_ms: 0,
            input_tokens: 1,
            usage: true,
            system_fingerprint: "fp".into(),
            timings: timings(&schedule),
        };
        let SynthPlan::Stream { frames, ending, .. } = plan(
            Wire::OpenAiChat,
            params,
            true,
            &schedule,
            OutputWords::Lorem,
        ) else {
            panic!("expected a stream");
        };
        assert_eq!(ending, Ending::Clean);
        let offsets: Vec<u64> = frames.iter().map(|f| f.offset.as_millis() as u64).collect();
        // role chunk, 4 tokens (stall before the second half), finish+usage+[DONE].
        assert_eq!(offsets, [0, 200, 210, 270, 280, 280]);
        assert!(frames[1].bytes.starts_with(b"data: "));
        assert!(frames[5].bytes.ends_with(b"data: [DONE]\n\n"));
    }

    #[test]
    fn pairs_fall_on_every_twelfth_token_frame_and_add_up() {
        let pairs = Grouping::PairEvery(PAIR_EVERY);
        // 13 tokens: 11 single frames, then one of two.
        let frames: Vec<u64> = (0..13).map(|k| pairs.tokens_of(k, 13)).collect();
        assert_eq!(frames, [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 0]);
        for tokens in 0..200 {
            for grouping in [Grouping::OnePerFrame, pairs] {
                let carried: Vec<u64> = (0..tokens + 1)
                    .map(|k| grouping.tokens_of(k, tokens))
                    .collect();
                assert_eq!(carried.iter().sum::<u64>(), tokens, "{grouping:?} {tokens}");
                // Frames with tokens come first, then none.
                let used = carried.iter().take_while(|&&c| c > 0).count();
                assert!(carried[used..].iter().all(|&c| c == 0));
            }
        }
        assert_eq!(
            (0..1200)
                .filter(|&k| pairs.tokens_of(k, 10_000) == 2)
                .count(),
            100
        );
    }
}
