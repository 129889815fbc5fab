//! Property tests (proptest) of the parts of `common` that read bytes from the network or
//! from a file: the stream parsers, the recording reader, the histogram decoder and the
//! event-stream frame cap. Each property states what must hold for *any* input: no panic,
//! the same events whatever the byte split, `file:line:` errors, round trips, bounded work.
//!
//! The case counts are small and fixed (`CASES` below) so the whole file runs in seconds in
//! CI. Raise them locally with proptest's usual `PROPTEST_CASES` environment variable, which
//! [`config`] honours over the counts here (an explicit `cases` would otherwise hide it), e.g.
//! `PROPTEST_CASES=5000 cargo test --release -p llm-replay-common --test properties`.
//! A failure is shrunk and its seed saved in `common/proptest-regressions/properties.txt`; commit that
//! file with the fix so the case is replayed first on every later run.

use std::io::Cursor;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::formats::encode::{self, Finish, ServerTimings, StreamEncoder, StreamParams, Wire};
use common::formats::{
    ContentKind, Ending, Event, Family, FrameError, MAX_EVENT_STREAM_FRAME_BYTES, StreamParser,
    Usage,
};
use common::metrics::{Counters, Metric, RunMetrics, SparseMetrics};
use common::recording::{
    Exchange, Frame, MAX_OFFSET_MS, RecordingReader, RecordingWriter, Request, Response,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

// ---------------------------------------------------------------------------------------------
// Configuration

/// Cases per property unless `PROPTEST_CASES` says otherwise.
const CASES: u32 = 256;

/// The proptest configuration of every property here: `CASES` cases, unless the
/// `PROPTEST_CASES` environment variable is set (then it wins, as in proptest's default).
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        // Relative to the crate directory, where `cargo test` runs: the default
        // (`SourceParallel`) looks for a `lib.rs` above the test file and, finding none in
        // `tests/`, saves nothing.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/properties.txt",
        ))),
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Stream parsers

const FAMILIES: [Family; 7] = [
    Family::OpenAiChat,
    Family::OpenAiCompletions,
    Family::OpenAiResponses,
    Family::Anthropic,
    Family::Ollama,
    Family::BedrockConverse,
    Family::BedrockInvoke,
];

const WIRES: [Wire; 8] = [
    Wire::OpenAiChat,
    Wire::OpenAiCompletions,
    Wire::OpenAiResponses,
    Wire::Anthropic,
    Wire::OllamaChat,
    Wire::OllamaGenerate,
    Wire::BedrockConverse,
    Wire::BedrockInvokeAnthropic,
];

/// Event types and field names of the streamed families (OpenAI chat, completions and
/// Responses, Anthropic, Ollama, Bedrock Converse and Invoke).
const STREAM_EVENT_TYPES: &[&str] = &[
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
    "response.created",
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.function_call_arguments.delta",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "messageStart",
    "contentBlockStart",
    "contentBlockDelta",
    "contentBlockStop",
    "messageStop",
    "metadata",
    "chunk",
    "modelStreamErrorException",
    "throttlingException",
];

const STREAM_KEYS: &[&str] = &[
    "type",
    "choices",
    "delta",
    "content",
    "text",
    "usage",
    "message",
    "error",
    "done",
    "response",
    "index",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "reasoning_content",
    "reasoning",
    "thinking",
    "partial_json",
    "input_tokens",
    "output_tokens",
    "prompt_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "cached_tokens",
    "cache_read_input_tokens",
    "stop_reason",
    "finish_reason",
    "item",
    "part",
    "status",
    "eval_count",
    "prompt_eval_count",
    "contentBlockDelta",
    "toolUse",
    "input",
    "reasoningContent",
    "inputTokens",
    "outputTokens",
    "cacheReadInputTokens",
    "metrics",
    "bytes",
    "amazon-bedrock-invocationMetrics",
    "inputTokenCount",
    "outputTokenCount",
];

/// An owned copy of an [`Event`], comparable in assertions.
#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Content(ContentKind, String),
    Usage(Usage),
    ServerCount(Usage),
    Terminal,
    Error(String),
}

fn own(event: Event<'_>) -> Ev {
    match event {
        Event::Content { kind, text } => Ev::Content(kind, text.into_owned()),
        Event::Usage(usage) => Ev::Usage(usage),
        Event::ServerCount(usage) => Ev::ServerCount(usage),
        Event::Terminal => Ev::Terminal,
        Event::Error { message } => Ev::Error(message.into_owned()),
    }
}

/// Parse `reads` in order, stopping at the first framing error.
fn parse_reads<'a>(
    family: Family,
    reads: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(Vec<Ev>, Ending), FrameError> {
    let mut parser = StreamParser::new(family);
    let mut events = Vec::new();
    for read in reads {
        parser.feed(read, &mut |event| events.push(own(event)))?;
    }
    let ending = parser.finish(&mut |event| events.push(own(event)));
    Ok((events, ending))
}

/// Feed every read, carrying on after framing errors (a caller may), then finish. Only
/// checks that nothing panics.
fn feed_everything<'a>(family: Family, reads: impl IntoIterator<Item = &'a [u8]>) {
    let mut parser = StreamParser::new(family);
    let mut events = 0usize;
    for read in reads {
        let _ = parser.feed(read, &mut |_| events += 1);
    }
    let _ = parser.finish(&mut |_| events += 1);
}

/// `bytes` cut at `cuts` (positions taken modulo `bytes.len() + 1`, in any order, repeats
/// allowed: an empty read is a read too).
fn cut_at<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut positions: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    positions.sort_unstable();
    let mut pieces = Vec::with_capacity(positions.len() + 1);
    let mut start = 0;
    for p in positions {
        pieces.push(&bytes[start..p]);
        start = p;
    }
    pieces.push(&bytes[start..]);
    pieces
}

/// How a generated stream ends.
#[derive(Debug, Clone)]
enum StreamEnd {
    Finish(Finish),
    Error(String),
}

/// Everything needed to encode one valid stream.
#[derive(Debug, Clone)]
struct StreamSpec {
    wire: Wire,
    id: String,
    model: String,
    usage: bool,
    input_tokens: u64,
    tokens: Vec<String>,
    pings_after: Vec<bool>,
    end: StreamEnd,
}

/// Token texts: any Unicode, with the characters the encoders must escape over-represented.
fn token_text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,6}",
        "[a-z \"\\\\\n\r\t<>&\u{0}\u{1f}é€😀]{0,6}",
        Just(String::new()),
    ]
}

fn stream_spec() -> impl Strategy<Value = StreamSpec> {
    (
        proptest::sample::select(WIRES.to_vec()),
        "[a-zA-Z0-9]{0,12}",
        ".{0,12}",
        any::<bool>(),
        0u64..100_000,
        proptest::collection::vec((token_text(), any::<bool>()), 0..12),
        prop_oneof![
            Just(StreamEnd::Finish(Finish::Stop)),
            Just(StreamEnd::Finish(Finish::Length)),
            // Never empty: the mock's messages are not, and an empty `error` is no error to
            // the clients (Python truthiness), so the parsers rightly ignore it.
            ".{1,16}".prop_map(StreamEnd::Error),
        ],
    )
        .prop_map(
            |(wire, id, model, usage, input_tokens, tokens, end)| StreamSpec {
                wire,
                id,
                model,
                usage,
                input_tokens,
                pings_after: tokens.iter().map(|(_, ping)| *ping).collect(),
                tokens: tokens.into_iter().map(|(text, _)| text).collect(),
                end,
            },
        )
}

/// Encode `spec` with the mock's encoders, as the mock writes it.
fn encode_stream(spec: &StreamSpec) -> Vec<u8> {
    let params = StreamParams {
        id: spec.id.clone(),
        model: spec.model.clone(),
        created_unix_ms: 1_700_000_000_123,
        input_tokens: spec.input_tokens,
        usage: spec.usage,
        system_fingerprint: "fp_test".to_owned(),
        timings: ServerTimings {
            total_ns: 2_000_000_000,
            load_ns: 1_000_000,
            prompt_eval_ns: 300_000_000,
            eval_ns: 1_700_000_000,
        },
    };
    let mut encoder = StreamEncoder::new(spec.wire, params);
    let mut out = Vec::new();
    encoder.preamble(&mut out);
    let last = spec.tokens.len().checked_sub(1);
    for (i, text) in spec.tokens.iter().enumerate() {
        let last_finish = match (&spec.end, Some(i) == last) {
            (StreamEnd::Finish(finish), true) => Some(*finish),
            _ => None,
        };
        encoder.token(text, last_finish, &mut out);
        if spec.pings_after[i] {
            encoder.ping(&mut out);
        }
    }
    match &spec.end {
        StreamEnd::Finish(finish) => encoder.finish(*finish, spec.tokens.len() as u64, &mut out),
        StreamEnd::Error(message) => encoder.error_frame(message, &mut out),
    }
    out
}

/// A valid stream and random cut positions into it.
fn stream_and_cuts() -> impl Strategy<Value = (StreamSpec, Vec<usize>)> {
    (
        stream_spec(),
        proptest::collection::vec(any::<usize>(), 0..24),
    )
}

proptest! {
    #![proptest_config(config(CASES))]

    /// Arbitrary bytes, cut anywhere, never panic any parser, nor does `finish`.
    #[test]
    fn parsers_survive_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        let pieces = cut_at(&bytes, &cuts);
        for family in FAMILIES {
            feed_everything(family, pieces.iter().copied());
            let _ = parse_reads(family, pieces.iter().copied());
        }
    }

    /// Arbitrary bytes that look like each family's framing (SSE `data:` lines, JSON lines)
    /// never panic either: random bytes rarely get past the framing, these do.
    #[test]
    fn parsers_survive_framed_garbage(
        lines in proptest::collection::vec(
            prop_oneof![
                "(event: [a-z_.]{0,20}\n)?data: [ -~]{0,40}\n\n",
                "data: \\{\"[a-z_]{1,8}\":[ -~]{0,30}\\}\n\n",
                "\\{\"[a-z_]{1,8}\":[ -~]{0,30}\\}\n",
                "data: \\[DONE\\]\n\n",
            ],
            0..12,
        ),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
    ) {
        let bytes = lines.concat().into_bytes();
        for family in FAMILIES {
            feed_everything(family, cut_at(&bytes, &cuts));
        }
    }

    /// Any split of a valid stream (random cuts, and one byte at a time) gives the events of
    /// the whole stream fed at once; the whole stream parses cleanly, carries the tokens'
    /// text in order, and ends with its terminal marker or its error.
    #[test]
    fn any_split_of_a_valid_stream_parses_the_same((spec, cuts) in stream_and_cuts()) {
        let family = spec.wire.family();
        let bytes = encode_stream(&spec);
        let whole = parse_reads(family, [bytes.as_slice()]);
        let (events, ending) = whole.clone().map_err(|e| {
            TestCaseError::fail(format!("{family:?}: valid stream rejected: {e}"))
        })?;
        prop_assert_eq!(ending, Ending::Clean);
        let text: String = events
            .iter()
            .filter_map(|e| match e {
                Ev::Content(ContentKind::Text, text) => Some(text.as_str()),
                _ => None,
            })
            .collect();
        prop_assert_eq!(text, spec.tokens.concat());
        match &spec.end {
            StreamEnd::Finish(_) => {
                prop_assert!(events.contains(&Ev::Terminal), "no terminal: {:?}", events);
                prop_assert!(!events.iter().any(|e| matches!(e, Ev::Error(_))));
            }
            StreamEnd::Error(_) => {
                prop_assert!(
                    events.iter().any(|e| matches!(e, Ev::Error(_))),
                    "no error event: {:?}",
                    events
                );
            }
        }

        let split = parse_reads(family, cut_at(&bytes, &cuts));
        prop_assert_eq!(&split, &whole, "{:?}: cut at {:?}", family, cuts);
        let bytewise = parse_reads(family, bytes.chunks(1));
        prop_assert_eq!(&bytewise, &whole, "{:?}: one byte at a time", family);
    }

    /// A valid stream with garbage inserted somewhere, or cut short, never panics, whatever
    /// the split.
    #[test]
    fn damaged_valid_streams_never_panic(
        (spec, cuts) in stream_and_cuts(),
        at in any::<usize>(),
        garbage in proptest::collection::vec(any::<u8>(), 0..32),
        truncate in any::<bool>(),
    ) {
        let family = spec.wire.family();
        let mut bytes = encode_stream(&spec);
        let at = at % (bytes.len() + 1);
        if truncate {
            bytes.truncate(at);
        } else {
            bytes.splice(at..at, garbage);
        }
        feed_everything(family, cut_at(&bytes, &cuts));
        let _ = parse_reads(family, bytes.chunks(1));
    }

    /// Well-framed frames (SSE events, NDJSON lines, event-stream frames with valid CRCs,
    /// Bedrock `chunk`s wrapping Anthropic events) whose JSON is random but built from the
    /// families' own field names and event types: this reaches the per-family semantics
    /// that random bytes stop short of. Never a panic, whatever the split.
    #[test]
    fn family_semantics_survive_random_json(
        frames in proptest::collection::vec(
            (proptest::sample::select(STREAM_EVENT_TYPES), json_with_keys(STREAM_KEYS), 0u8..4),
            1..8,
        ),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut sse = Vec::new();
        let mut ndjson = Vec::new();
        let mut event_stream = Vec::new();
        for (event_type, json, shape) in &frames {
            let json = json.to_string();
            if *shape == 0 {
                sse.extend_from_slice(format!("data: {json}\n\n").as_bytes());
            } else {
                sse.extend_from_slice(format!("event: {event_type}\ndata: {json}\n\n").as_bytes());
            }
            ndjson.extend_from_slice(format!("{json}\n").as_bytes());
            match shape {
                0 => encode::bedrock_chunk_frame(json.as_bytes(), None, &mut event_stream),
                1 => encode::bedrock_exception_frame(event_type, json.as_bytes(), &mut event_stream),
                _ => encode::bedrock_event_frame(event_type, json.as_bytes(), &mut event_stream),
            }
        }
        for family in FAMILIES {
            let bytes = match family {
                Family::Ollama => &ndjson,
                Family::BedrockConverse | Family::BedrockInvoke => &event_stream,
                _ => &sse,
            };
            feed_everything(family, cut_at(bytes, &cuts));
            let _ = parse_reads(family, [bytes.as_slice()]);
        }
    }

    /// An event-stream prelude (with a correct CRC) claiming a frame over the cap is
    /// `FrameTooLarge` as soon as its 12 bytes are in, whatever the split and whatever
    /// follows: never a wait for, or an allocation of, that many bytes.
    #[test]
    fn oversized_event_stream_frame_is_refused(
        total in (MAX_EVENT_STREAM_FRAME_BYTES as u32 + 1)..=u32::MAX,
        headers_len in any::<u32>(),
        tail in proptest::collection::vec(any::<u8>(), 0..64),
        cuts in proptest::collection::vec(0usize..12, 0..6),
        after_valid_frame in any::<bool>(),
        family in prop_oneof![Just(Family::BedrockConverse), Just(Family::BedrockInvoke)],
    ) {
        let mut bytes = Vec::new();
        if after_valid_frame {
            // A whole valid frame first, so the prelude arrives in the middle of the stream.
            let mut encoder = StreamEncoder::new(Wire::BedrockConverse, StreamParams {
                id: String::new(),
                model: String::new(),
                created_unix_ms: 0,
                input_tokens: 0,
                usage: false,
                system_fingerprint: String::new(),
                timings: ServerTimings::default(),
            });
            encoder.preamble(&mut bytes);
        }
        let start = bytes.len();
        bytes.extend_from_slice(&total.to_be_bytes());
        bytes.extend_from_slice(&headers_len.to_be_bytes());
        let crc = crc32(&bytes[start..start + 8]);
        bytes.extend_from_slice(&crc.to_be_bytes());
        bytes.extend_from_slice(&tail);
        let cuts: Vec<usize> = cuts.iter().map(|c| start + c).collect();
        let result = parse_reads(family, cut_at(&bytes, &cuts));
        prop_assert_eq!(
            result,
            Err(FrameError::FrameTooLarge {
                len: total as usize,
                cap: MAX_EVENT_STREAM_FRAME_BYTES,
            })
        );
    }
}

/// CRC-32 (IEEE, the event-stream prelude's checksum), bit by bit: tiny and obviously right.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn crc32_matches_the_check_value() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
}

// ---------------------------------------------------------------------------------------------
// Recording reader

/// Read `bytes` as `rec.jsonl` to the end; every error must display as `rec.jsonl:LINE: ...`
/// with LINE in range. Returns the exchanges read.
fn read_recording(bytes: Vec<u8>) -> Result<Vec<(u64, Exchange)>, TestCaseError> {
    let lines = bytes.split(|&b| b == b'\n').count() as u64;
    let reader =
        RecordingReader::from_reader(PathBuf::from("rec.jsonl"), Box::new(Cursor::new(bytes)));
    let mut exchanges = Vec::new();
    for item in reader {
        match item {
            Ok(exchange) => exchanges.push(exchange),
            Err(e) => {
                let line = e
                    .line()
                    .ok_or_else(|| TestCaseError::fail("error without a line"))?;
                prop_assert!(
                    (1..=lines).contains(&line),
                    "line {} out of 1..={}",
                    line,
                    lines
                );
                let shown = e.to_string();
                let prefix = format!("rec.jsonl:{line}: ");
                prop_assert!(shown.starts_with(&prefix), "{:?} lacks {:?}", shown, prefix);
            }
        }
    }
    Ok(exchanges)
}

/// JSON values whose object keys come from `keys` (a format's own vocabulary, so they get
/// past the first field) and whose leaves are anything.
fn json_with_keys(keys: &'static [&'static str]) -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        (0u64..70_000).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
        "/[a-z/?=&]{0,12}".prop_map(Value::String),
        "[A-Za-z0-9+/=]{0,12}".prop_map(Value::String),
        "[A-Z]{1,6}".prop_map(Value::String),
    ];
    let key = proptest::sample::select(keys);
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((key.clone(), inner), 0..6).prop_map(|pairs| {
                Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

/// The recording's field names.
const RECORDING_KEYS: &[&str] = &[
    "id", "session", "at_ms", "request", "response", "method", "path", "headers", "body",
    "body_b64", "status", "frames", "complete", "t_ms", "data", "data_b64", "other",
];

fn json_ish() -> impl Strategy<Value = serde_json::Value> {
    json_with_keys(RECORDING_KEYS)
}

/// Exchanges the writer writes unchanged: no credential headers or query parameters, offsets
/// in range and short in decimal (so the text round trip is exact).
fn valid_exchange() -> impl Strategy<Value = Exchange> {
    let offset = (0u64..(MAX_OFFSET_MS as u64 * 8)).prop_map(|n| n as f64 / 8.0);
    let headers = proptest::collection::btree_map(
        prop_oneof![
            Just("content-type".to_owned()),
            Just("accept".to_owned()),
            "x-h[0-9]{1,3}"
        ],
        ".{0,12}",
        0..3,
    );
    let body = prop_oneof![
        Just((None, None)),
        ".{0,24}".prop_map(|b| (Some(b), None)),
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(|b| (
            None,
            Some(base64::engine::general_purpose::STANDARD.encode(b))
        )),
    ];
    let request = (
        "[A-Z]{1,7}",
        "/[a-z0-9/]{0,16}",
        headers.clone(),
        body,
        proptest::option::of(".{0,8}"),
    )
        .prop_map(|(method, path, headers, (body, body_b64), extra)| {
            let mut unknown = serde_json::Map::new();
            if let Some(extra) = extra {
                unknown.insert("x_extra".to_owned(), serde_json::Value::String(extra));
            }
            Request {
                method,
                path,
                headers,
                body,
                body_b64,
                unknown,
            }
        });
    let frames = proptest::collection::vec(
        (
            proptest::option::of(offset.clone()),
            proptest::collection::vec(any::<u8>(), 0..16),
        )
            .prop_map(|(t_ms, bytes)| Frame::from_bytes(t_ms, &bytes)),
        0..4,
    );
    let response = (any::<u16>(), headers, frames, any::<bool>()).prop_map(
        |(status, headers, frames, complete)| Response {
            status,
            headers,
            frames,
            complete,
            unknown: serde_json::Map::new(),
        },
    );
    (
        proptest::option::of(".{0,8}"),
        proptest::option::of(".{0,8}"),
        proptest::option::of(offset),
        request,
        proptest::option::of(response),
    )
        .prop_map(|(id, session, at_ms, request, response)| Exchange {
            id,
            session,
            at_ms,
            request,
            response,
            unknown: serde_json::Map::new(),
        })
}

/// A `Write` into a shared buffer, so the bytes can be read after the writer is finished.
#[derive(Clone, Default)]
struct SharedBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for SharedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

proptest! {
    #![proptest_config(config(CASES))]

    /// Arbitrary bytes never panic the reader, and every error names `rec.jsonl:LINE:`.
    #[test]
    fn recording_reader_survives_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..1024),
    ) {
        read_recording(bytes)?;
    }

    /// Arbitrary JSON-ish lines (the recording's own field names, any values, blank lines,
    /// a torn last line) never panic the reader, and every error names `rec.jsonl:LINE:`.
    #[test]
    fn recording_reader_survives_json_ish_lines(
        lines in proptest::collection::vec(
            prop_oneof![
                json_ish().prop_map(|v| v.to_string()),
                Just(String::new()),
                "[ -~]{0,24}",
            ],
            0..8,
        ),
        newline_at_end in any::<bool>(),
    ) {
        let mut text = lines.join("\n");
        if newline_at_end {
            text.push('\n');
        }
        read_recording(text.into_bytes())?;
    }

    /// A valid exchange written by `RecordingWriter` reads back equal, on the line it was
    /// written to.
    #[test]
    fn valid_exchanges_round_trip(exchanges in proptest::collection::vec(valid_exchange(), 1..4)) {
        let buffer = SharedBuffer::default();
        let mut writer = RecordingWriter::from_writer(Box::new(buffer.clone()));
        for exchange in &exchanges {
            writer.write(exchange).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        writer.finish().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let bytes = buffer.0.lock().expect("not poisoned").clone();
        let read = read_recording(bytes)?;
        let expected: Vec<(u64, Exchange)> = exchanges
            .into_iter()
            .enumerate()
            .map(|(i, e)| (i as u64 + 1, e))
            .collect();
        prop_assert_eq!(read, expected);
    }
}

// ---------------------------------------------------------------------------------------------
// Histogram decoder

/// A decode of hostile bytes must not do work (or allocation) proportional to what the bytes
/// claim. A generous bound, far above the few milliseconds a case takes, so that only a
/// runaway decoder fails it on a loaded machine.
const DECODE_PATIENCE: Duration = Duration::from_secs(1);

/// Metrics with random values recorded in random metrics. Values stay under 2^50, below the
/// decoder's cap on the highest trackable value.
fn random_metrics() -> impl Strategy<Value = RunMetrics> {
    proptest::collection::vec(
        (
            proptest::sample::select(Metric::ALL.to_vec()),
            prop_oneof![0u64..1_000, 0u64..10_000_000, 0u64..(1 << 50)],
        ),
        0..64,
    )
    .prop_map(|values| {
        let mut metrics = RunMetrics::new();
        for (metric, value) in values {
            metrics.record_value(metric, value);
        }
        metrics
    })
}

/// Decode with both decoders, asserting no panic and bounded time, and that the sparse
/// decoder (the coordinator's) takes nothing the dense one refuses and adds exactly what the
/// dense one decoded; the result is whatever the dense decoder says.
fn timed_decode(encoded: &[Vec<u8>]) -> Result<bool, TestCaseError> {
    let started = Instant::now();
    let dense = RunMetrics::decode(encoded, Counters::default(), None);
    let sparse = SparseMetrics::decode_with_connections(encoded, &[], Counters::default(), None);
    let took = started.elapsed();
    prop_assert!(took < DECODE_PATIENCE, "decode took {:?}", took);
    if let Ok(sparse) = &sparse {
        let Ok(dense) = &dense else {
            return Err(TestCaseError::fail(
                "the sparse decoder took what the dense one refused",
            ));
        };
        let (mut from_sparse, mut from_dense) = (RunMetrics::new(), RunMetrics::new());
        from_sparse.merge_sparse(sparse);
        from_dense.merge(dense);
        for metric in Metric::ALL {
            prop_assert!(
                from_sparse.histogram(metric) == from_dense.histogram(metric),
                "{:?}: {:?} != {:?}",
                metric,
                sparse.histogram(metric),
                from_dense.stats(metric)
            );
        }
    }
    Ok(dense.is_ok())
}

/// One way to damage an encoded histogram.
#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, mask: u8 },
    Truncate { at: usize },
    Extend { bytes: Vec<u8> },
    Overwrite { at: usize, bytes: Vec<u8> },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        proptest::collection::vec(any::<u8>(), 1..64).prop_map(|bytes| Mutation::Extend { bytes }),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, bytes)| Mutation::Overwrite { at, bytes }),
    ]
}

fn apply(mutation: &Mutation, bytes: &mut Vec<u8>) {
    match mutation {
        Mutation::Flip { at, mask } => {
            if !bytes.is_empty() {
                let at = at % bytes.len();
                bytes[at] ^= mask;
            }
        }
        Mutation::Truncate { at } => bytes.truncate(at % (bytes.len() + 1)),
        Mutation::Extend { bytes: more } => bytes.extend_from_slice(more),
        Mutation::Overwrite { at, bytes: with } => {
            // Lengths and cookies live in the first bytes: aim there as often as anywhere.
            let at = at % (bytes.len() + 1);
            for (i, b) in with.iter().enumerate() {
                match bytes.get_mut(at + i) {
                    Some(slot) => *slot = *b,
                    None => bytes.push(*b),
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config(CASES))]

    /// Arbitrary bytes in place of any one of the eight histograms: Ok or Err, no panic.
    #[test]
    fn histogram_decoder_survives_arbitrary_bytes(
        metrics in random_metrics(),
        which in 0..Metric::ALL.len(),
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut encoded = metrics.encode_histograms();
        encoded[which] = bytes;
        timed_decode(&encoded)?;
    }

    /// A valid encoding flipped, truncated, extended or overwritten (several times, in
    /// several histograms) never panics and is decoded (or refused) quickly: the decoder
    /// checks lengths before it trusts them.
    #[test]
    fn histogram_decoder_survives_mutations(
        metrics in random_metrics(),
        mutations in proptest::collection::vec((0..Metric::ALL.len(), mutation()), 1..6),
    ) {
        let mut encoded = metrics.encode_histograms();
        for (which, mutation) in &mutations {
            apply(mutation, &mut encoded[*which]);
        }
        timed_decode(&encoded)?;
    }

    /// The same, one layer down: the inflated V2 encoding (cookie, payload length,
    /// precision, value range, counts) damaged and deflated again, so the damage gets past
    /// the DEFLATE checksum to the header checks and the counts decoder.
    #[test]
    fn histogram_decoder_survives_inner_mutations(
        metrics in random_metrics(),
        which in 0..Metric::ALL.len(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let mut encoded = metrics.encode_histograms();
        let mut inner = inflate(&encoded[which][8..])?;
        for mutation in &mutations {
            apply(mutation, &mut inner);
        }
        encoded[which] = deflate_v2(&encoded[which][..4], &inner)?;
        timed_decode(&encoded)?;
    }

    /// A valid encoding decodes to the same distributions.
    #[test]
    fn valid_histograms_round_trip(metrics in random_metrics()) {
        let encoded = metrics.encode_histograms();
        let decoded = RunMetrics::decode(&encoded, Counters::default(), None)
            .map_err(|e| TestCaseError::fail(format!("valid encoding refused: {e}")))?;
        prop_assert!(timed_decode(&encoded)?);
        let sparse = SparseMetrics::decode_with_connections(&encoded, &[], Counters::default(), None)
            .map_err(|e| TestCaseError::fail(format!("valid encoding refused: {e}")))?;
        for metric in Metric::ALL {
            prop_assert_eq!(decoded.stats(metric), metrics.stats(metric), "{:?}", metric);
            prop_assert_eq!(sparse.stats(metric), metrics.stats(metric), "{:?}", metric);
            prop_assert_eq!(
                decoded.histogram(metric).len(),
                metrics.histogram(metric).len(),
                "{:?}",
                metric
            );
        }
    }
}

fn inflate(zlib: &[u8]) -> Result<Vec<u8>, TestCaseError> {
    use std::io::Read as _;
    let mut inner = Vec::new();
    flate2::read::ZlibDecoder::new(zlib)
        .read_to_end(&mut inner)
        .map_err(|e| TestCaseError::fail(format!("our own encoding does not inflate: {e}")))?;
    Ok(inner)
}

/// `cookie`, the compressed length and `inner` deflated: the V2+DEFLATE envelope.
fn deflate_v2(cookie: &[u8], inner: &[u8]) -> Result<Vec<u8>, TestCaseError> {
    use std::io::Write as _;
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    encoder
        .write_all(inner)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let zlib = encoder
        .finish()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut out = cookie.to_vec();
    out.extend_from_slice(&(zlib.len() as u32).to_be_bytes());
    out.extend_from_slice(&zlib);
    Ok(out)
}
