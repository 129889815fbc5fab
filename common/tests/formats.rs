//! Golden tests of `common::formats` on the literal frames of the wire reference
//! (`tests/fixtures/`, see its README), under every byte split.

use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine as _;
use common::formats::{
    ContentKind, Ending, Event, Family, FrameError, MAX_EVENT_STREAM_FRAME_BYTES, StreamParser,
    Unstreamed, Usage, detect, family_for_path, unstreamed,
};
use common::measure::{FailureKind, OutcomeKind, RequestOutcome, measure_frames};

// ---------------------------------------------------------------------------------------------
// Helpers

/// An owned copy of an [`Event`], comparable in assertions.
#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Text(String),
    Reasoning(String),
    Tool(String),
    Usage(Option<u64>, Option<u64>),
    ServerCount(Option<u64>, Option<u64>),
    Terminal,
    Error(String),
}

fn own(event: Event<'_>) -> Ev {
    match event {
        Event::Content {
            kind: ContentKind::Text,
            text,
        } => Ev::Text(text.into_owned()),
        Event::Content {
            kind: ContentKind::Reasoning,
            text,
        } => Ev::Reasoning(text.into_owned()),
        Event::Content {
            kind: ContentKind::ToolCall,
            text,
        } => Ev::Tool(text.into_owned()),
        Event::Usage(Usage {
            input_tokens,
            output_tokens,
            ..
        }) => Ev::Usage(input_tokens, output_tokens),
        Event::ServerCount(Usage {
            input_tokens,
            output_tokens,
            ..
        }) => Ev::ServerCount(input_tokens, output_tokens),
        Event::Terminal => Ev::Terminal,
        Event::Error { message } => Ev::Error(message.into_owned()),
    }
}

fn text(s: &str) -> Ev {
    Ev::Text(s.to_owned())
}

/// Parse `reads` in order; the events and the ending, or the first framing error.
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

/// Parse `bytes` as one read, then check that every split gives the same result: at each
/// position into two reads, one byte at a time, and seven bytes at a time.
fn parse_all_splits(family: Family, bytes: &[u8]) -> (Vec<Ev>, Ending) {
    let whole = parse_reads(family, [bytes]).expect("valid stream");
    for i in 0..=bytes.len() {
        let split = parse_reads(family, [&bytes[..i], &bytes[i..]]).expect("valid stream");
        assert_eq!(split, whole, "{family:?}: split at byte {i}");
    }
    for size in [1, 7] {
        let pieces = parse_reads(family, bytes.chunks(size)).expect("valid stream");
        assert_eq!(pieces, whole, "{family:?}: {size} bytes at a time");
    }
    whole
}

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn hex_fixture(name: &str) -> Vec<u8> {
    let hex = String::from_utf8(fixture(name)).expect("hex is ASCII");
    let hex = hex.trim();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digits"))
        .collect()
}

/// The measurement of `bytes` as one read.
fn measure(family: Family, bytes: &[u8]) -> RequestOutcome {
    measure_frames(family, [(1_000, bytes)])
}

fn content_count(events: &[Ev]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Ev::Text(_) | Ev::Reasoning(_) | Ev::Tool(_)))
        .count()
}

/// A Bedrock event frame, as the service writes it.
fn bedrock_event(event_type: &str, payload: &str) -> Vec<u8> {
    let message = Message::new(bytes::Bytes::from(payload.to_owned()))
        .add_header(Header::new(
            ":event-type",
            HeaderValue::String(event_type.to_owned().into()),
        ))
        .add_header(Header::new(
            ":content-type",
            HeaderValue::String("application/json".into()),
        ))
        .add_header(Header::new(
            ":message-type",
            HeaderValue::String("event".into()),
        ));
    let mut out = Vec::new();
    aws_smithy_eventstream::frame::write_message_to(&message, &mut out).expect("encodable frame");
    out
}

/// A Bedrock Invoke `chunk` frame carrying `inner` JSON.
fn invoke_chunk(inner: &str, padding: &str) -> Vec<u8> {
    let encoded = base64::engine::general_purpose::STANDARD.encode(inner);
    bedrock_event(
        "chunk",
        &format!(r#"{{"bytes":"{encoded}","p":"{padding}"}}"#),
    )
}

/// The `data:` JSON lines of an SSE fixture, for re-wrapping them.
fn sse_data_lines(sse: &[u8]) -> Vec<String> {
    String::from_utf8(sse.to_vec())
        .expect("utf-8")
        .lines()
        .filter_map(|line| line.strip_prefix("data: ").map(str::to_owned))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// OpenAI Chat Completions and legacy Completions

#[test]
fn openai_chat_literal_stream() {
    let bytes = fixture("openai_chat.sse");
    let (events, ending) = parse_all_splits(Family::OpenAiChat, &bytes);
    // The role-only first chunk, the finish chunk and the usage chunk carry no content.
    assert_eq!(
        events,
        vec![
            text("Hello"),
            text(" world"),
            Ev::Usage(Some(9), Some(2)),
            Ev::Terminal
        ]
    );
    assert_eq!(ending, Ending::Clean);
    let outcome = measure(Family::OpenAiChat, &bytes);
    assert_eq!(outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(outcome.content_frames, 2);
    assert_eq!(outcome.usage_output_tokens, Some(2));
    assert_eq!(outcome.input_tokens, Some(9));
}

#[test]
fn openai_tool_call_deltas() {
    let (events, ending) = parse_all_splits(Family::OpenAiChat, &fixture("openai_tool_calls.sse"));
    assert_eq!(
        events,
        vec![
            Ev::Tool("get_weather".to_owned()),
            Ev::Tool(r#"{"loc"#.to_owned()),
            Ev::Tool(r#"ation":"Paris"}"#.to_owned()),
            Ev::Terminal
        ]
    );
    assert_eq!(ending, Ending::Clean);
}

#[test]
fn openai_legacy_completions_literal_stream() {
    let (events, ending) = parse_all_splits(
        Family::OpenAiCompletions,
        &fixture("openai_completions.sse"),
    );
    assert_eq!(
        events,
        vec![
            text("Hello"),
            text(" world"),
            Ev::Usage(Some(3), Some(2)),
            Ev::Terminal
        ]
    );
    assert_eq!(ending, Ending::Clean);
}

#[test]
fn openai_error_frame_then_done_is_a_failure() {
    // OpenAI's frame, then vLLM's `[DONE]` after it.
    let mut bytes = fixture("openai_error.sse");
    bytes.extend_from_slice(b"data: [DONE]\n\n");
    let (events, _) = parse_all_splits(Family::OpenAiChat, &bytes);
    assert_eq!(
        events,
        vec![
            Ev::Error(
                "The server had an error while processing your request. Sorry about that!"
                    .to_owned()
            ),
            Ev::Terminal
        ]
    );
    let outcome = measure(Family::OpenAiChat, &bytes);
    assert_eq!(outcome.kind, OutcomeKind::Failed(FailureKind::ErrorFrame));
}

#[test]
fn openai_error_variants_of_compatible_servers() {
    let chunk = r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#;
    let cases: [(&str, String); 4] = [
        (
            "vLLM",
            r#"data: {"error": {"message": "bad", "type": "BadRequestError", "param": null, "code": 400}}"#
                .to_owned(),
        ),
        (
            "TGI (no space)",
            r#"data:{"error":{"message":"Input validation error","http_status_code":422}}"#
                .to_owned(),
        ),
        (
            "older vLLM",
            r#"data: {"object":"error","message":"old","type":"x","param":null,"code":400}"#
                .to_owned(),
        ),
        (
            "OpenRouter",
            r#"data: {"id":"g","object":"chat.completion.chunk","error":{"code":502,"message":"Provider disconnected"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}"#
                .to_owned(),
        ),
    ];
    for (server, error) in cases {
        let stream = format!("{chunk}\n\n{error}\n\ndata:[DONE]\n\n");
        let (events, ending) = parse_all_splits(Family::OpenAiChat, stream.as_bytes());
        assert_eq!(events.len(), 3, "{server}: {events:?}");
        assert_eq!(events[0], text("Hi"), "{server}");
        assert!(matches!(events[1], Ev::Error(_)), "{server}: {events:?}");
        assert_eq!(events[2], Ev::Terminal, "{server}");
        assert_eq!(ending, Ending::Clean);
        assert_eq!(
            measure(Family::OpenAiChat, stream.as_bytes()).kind,
            OutcomeKind::Failed(FailureKind::ErrorFrame),
            "{server}"
        );
    }
    // A falsy `error` member is not an error (the SDK's test is truthiness).
    let stream =
        "data: {\"error\":null,\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n";
    let (events, _) = parse_reads(Family::OpenAiChat, [stream.as_bytes()]).expect("valid");
    assert_eq!(events, vec![text("a"), Ev::Terminal]);
}

#[test]
fn openai_missing_done_is_no_terminal() {
    let bytes = fixture("openai_chat.sse");
    let without_done = &bytes[..bytes.len() - b"data: [DONE]\n\n".len()];
    let (events, ending) = parse_all_splits(Family::OpenAiChat, without_done);
    assert!(!events.contains(&Ev::Terminal));
    assert_eq!(content_count(&events), 2);
    assert_eq!(ending, Ending::Clean);
    let outcome = measure(Family::OpenAiChat, without_done);
    assert_eq!(outcome.kind, OutcomeKind::EndedEarly);

    // Cut inside the third frame: the partial event is reported, not parsed.
    let cut = &bytes[..bytes.len() / 2];
    let (events, ending) = parse_reads(Family::OpenAiChat, [cut]).expect("valid so far");
    assert!(!events.contains(&Ev::Terminal));
    assert_eq!(ending, Ending::TrailingPartialFrame);
    // `[DONE]` without its blank line is not dispatched either (WHATWG: discarded at EOF).
    let (events, ending) =
        parse_reads(Family::OpenAiChat, [&bytes[..bytes.len() - 1]]).expect("valid");
    assert!(!events.contains(&Ev::Terminal));
    assert_eq!(ending, Ending::TrailingPartialFrame);
}

#[test]
fn openai_cumulative_usage_on_every_chunk_last_wins() {
    // vLLM `continuous_usage_stats` (usage on every chunk, then the usage chunk) and NIM
    // (a cumulative snapshot repeated on every chunk, usage riding on content chunks).
    let vllm = concat!(
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":9,\"total_tokens\":9,\"completion_tokens\":0}}\n\n",
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":9,\"total_tokens\":10,\"completion_tokens\":1}}\n\n",
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}],\"usage\":{\"prompt_tokens\":9,\"total_tokens\":11,\"completion_tokens\":2}}\n\n",
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"total_tokens\":11,\"completion_tokens\":2}}\n\n",
        "data: [DONE]\n\n",
    );
    let (events, _) = parse_all_splits(Family::OpenAiChat, vllm.as_bytes());
    assert_eq!(
        events,
        vec![
            Ev::Usage(Some(9), None), // completion 0 on a chunk with choices: unknown
            text("Hello"),
            Ev::Usage(Some(9), Some(1)),
            text(" world"),
            Ev::Usage(Some(9), Some(2)),
            Ev::Usage(Some(9), Some(2)),
            Ev::Terminal
        ]
    );
    let outcome = measure(Family::OpenAiChat, vllm.as_bytes());
    assert_eq!(outcome.usage_output_tokens, Some(2));
    assert_eq!(outcome.content_frames, 2);

    let nim = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"think\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"A\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"B\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}\n\n",
        "data: [DONE]\n\n",
    );
    let outcome = measure(Family::OpenAiChat, nim.as_bytes());
    assert_eq!(outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(outcome.usage_output_tokens, Some(3));
    assert_eq!(outcome.input_tokens, Some(5));
    assert_eq!(outcome.content_frames, 3);
}

#[test]
fn ollama_compat_zero_usage_on_intermediate_chunks_is_not_final() {
    let chunk = |text: &str| {
        format!(
            "data: {{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{{\"text\":\"{text}\",\"index\":0,\"finish_reason\":null}}],\"usage\":{{\"prompt_tokens\":0,\"completion_tokens\":0,\"total_tokens\":0}},\"system_fingerprint\":\"fp_ollama\"}}\n\n"
        )
    };
    let truncated = format!("{}{}", chunk("Hello"), chunk(" world"));
    let (events, _) = parse_all_splits(Family::OpenAiCompletions, truncated.as_bytes());
    assert_eq!(events, vec![text("Hello"), text(" world")]);
    let outcome = measure(Family::OpenAiCompletions, truncated.as_bytes());
    assert_eq!(outcome.kind, OutcomeKind::EndedEarly);
    assert_eq!(outcome.usage_output_tokens, None);
    assert_eq!(outcome.output_tokens(), 2);

    let complete = format!(
        "{truncated}data: {{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[],\"usage\":{{\"prompt_tokens\":4,\"completion_tokens\":2,\"total_tokens\":6}}}}\n\ndata: [DONE]\n\n"
    );
    let outcome = measure(Family::OpenAiCompletions, complete.as_bytes());
    assert_eq!(outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(outcome.usage_output_tokens, Some(2));
}

#[test]
fn azure_prompt_filter_preamble_is_not_content() {
    let stream = concat!(
        "data: {\"choices\":[],\"created\":0,\"id\":\"\",\"model\":\"\",\"object\":\"\",\"prompt_filter_results\":[{\"prompt_index\":0,\"content_filter_results\":{\"hate\":{\"filtered\":false,\"severity\":\"safe\"}}}]}\n\n",
        "data: {\"choices\":[{\"content_filter_results\":{},\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null,\"index\":0,\"logprobs\":null}],\"created\":1735689600,\"id\":\"chatcmpl-az\",\"model\":\"gpt-4o\",\"object\":\"chat.completion.chunk\"}\n\n",
        "data: {\"choices\":[{\"content_filter_results\":{},\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null,\"index\":0}],\"created\":1735689600,\"id\":\"chatcmpl-az\",\"model\":\"gpt-4o\",\"object\":\"chat.completion.chunk\"}\n\n",
        "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\",\"index\":0}],\"created\":1735689600,\"id\":\"chatcmpl-az\",\"model\":\"gpt-4o\",\"object\":\"chat.completion.chunk\"}\n\n",
        "data: [DONE]\n\n",
    );
    let (events, _) = parse_all_splits(Family::OpenAiChat, stream.as_bytes());
    assert_eq!(events, vec![text("Hi"), Ev::Terminal]);
    assert_eq!(
        detect(
            "/unknown/gateway",
            Some("text/event-stream"),
            stream.as_bytes()
        ),
        Some(Family::OpenAiChat)
    );
}

#[test]
fn reasoning_and_reasoning_content() {
    let stream = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"reasoning\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"Let me\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":null,\"reasoning_content\":\" think\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"42\"}}]}\n\n",
        "data: [DONE]\n\n",
    );
    let (events, _) = parse_all_splits(Family::OpenAiChat, stream.as_bytes());
    assert_eq!(
        events,
        vec![
            Ev::Reasoning("Let me".to_owned()),
            Ev::Reasoning(" think".to_owned()),
            text("42"),
            Ev::Terminal
        ]
    );
}

#[test]
fn tgi_no_space_keep_alives_and_comments() {
    let stream = concat!(
        ":\n\n",
        ": OPENROUTER PROCESSING\n\n",
        "data:{\"object\":\"chat.completion.chunk\",\"id\":\"\",\"created\":1,\"model\":\"tgi\",\"system_fingerprint\":\"3.0.0-native\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
        ":\n\n",
        ": keep-alive\n",
        "data:{\"object\":\"chat.completion.chunk\",\"id\":\"\",\"created\":1,\"model\":\"tgi\",\"system_fingerprint\":\"3.0.0-native\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"lo\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
        "data:{\"object\":\"chat.completion.chunk\",\"id\":\"\",\"created\":1,\"model\":\"tgi\",\"system_fingerprint\":\"3.0.0-native\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n",
        "data:[DONE]\n\n",
    );
    let (events, ending) = parse_all_splits(Family::OpenAiChat, stream.as_bytes());
    assert_eq!(
        events,
        vec![
            text("Hel"),
            text("lo"),
            Ev::Usage(Some(3), Some(2)),
            Ev::Terminal
        ]
    );
    assert_eq!(ending, Ending::Clean);
}

#[test]
fn crlf_and_lone_cr_line_endings() {
    let lf = fixture("openai_chat.sse");
    let expected = parse_reads(Family::OpenAiChat, [&lf[..]]).expect("valid");
    let lf = String::from_utf8(lf).expect("utf-8");
    // Every split of the CRLF version includes a `\r` | `\n` split between reads.
    for ending in ["\r\n", "\r"] {
        let converted = lf.replace('\n', ending);
        let got = parse_all_splits(Family::OpenAiChat, converted.as_bytes());
        assert_eq!(got, expected, "line ending {ending:?}");
    }
    // An explicit `\r` | `\n` split at the blank line of the last event.
    let crlf = lf.replace('\n', "\r\n");
    let at = crlf.len() - 1;
    let split = parse_reads(
        Family::OpenAiChat,
        [&crlf.as_bytes()[..at], &crlf.as_bytes()[at..]],
    )
    .expect("valid");
    assert_eq!(split, expected);
}

#[test]
fn choices_null_or_missing_in_the_usage_chunk() {
    for choices in ["\"choices\":null,", ""] {
        let stream = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"x\"}}}}]}}\n\ndata: {{{choices}\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":1}}}}\n\ndata: [DONE]\n\n"
        );
        let (events, _) = parse_all_splits(Family::OpenAiChat, stream.as_bytes());
        assert_eq!(
            events,
            vec![text("x"), Ev::Usage(Some(1), Some(1)), Ev::Terminal]
        );
    }
}

#[test]
fn escaped_text_is_unescaped() {
    let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"a\\nb \\u00e9 \\\"q\\\"\"}}]}\n\n";
    let (events, _) = parse_reads(Family::OpenAiChat, [stream.as_bytes()]).expect("valid");
    assert_eq!(events, vec![text("a\nb é \"q\"")]);
}

#[test]
fn non_json_data_is_a_malformed_frame() {
    let result = parse_reads(Family::OpenAiChat, [&b"data: {\"choices\":[\n\n"[..]]);
    assert!(
        matches!(
            result,
            Err(FrameError::Malformed {
                family: "openai-chat",
                ..
            })
        ),
        "{result:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// OpenAI Responses

#[test]
fn openai_responses_literal_stream() {
    let bytes = fixture("openai_responses.sse");
    let (events, ending) = parse_all_splits(Family::OpenAiResponses, &bytes);
    assert_eq!(
        events,
        vec![
            text("Hello"),
            text(" world"),
            Ev::Usage(Some(9), Some(2)),
            Ev::Terminal
        ]
    );
    assert_eq!(ending, Ending::Clean);
    assert_eq!(
        measure(Family::OpenAiResponses, &bytes).kind,
        OutcomeKind::Succeeded
    );
}

#[test]
fn openai_responses_error_event_and_failed() {
    let error = fixture("openai_responses_error.sse");
    let (events, _) = parse_all_splits(Family::OpenAiResponses, &error);
    assert_eq!(
        events,
        vec![Ev::Error(
            "The server had an error while processing your request.".to_owned()
        )]
    );
    // Usually followed by `response.failed`.
    let mut stream = fixture("openai_responses.sse");
    let cut = String::from_utf8(stream.clone())
        .expect("utf-8")
        .find("event: response.output_text.done")
        .expect("fixture has it");
    stream.truncate(cut);
    stream.extend_from_slice(&error);
    stream.extend_from_slice(
        b"event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":6,\"response\":{\"id\":\"resp_123\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"boom\"},\"usage\":null}}\n\n",
    );
    let (events, _) = parse_all_splits(Family::OpenAiResponses, &stream);
    assert_eq!(
        events,
        vec![
            text("Hello"),
            text(" world"),
            Ev::Error("The server had an error while processing your request.".to_owned()),
            Ev::Error("boom".to_owned()),
        ]
    );
    assert_eq!(
        measure(Family::OpenAiResponses, &stream).kind,
        OutcomeKind::Failed(FailureKind::ErrorFrame)
    );
}

#[test]
fn openai_responses_other_deltas_and_incomplete() {
    // Dispatch is on the JSON `type`, so the event lines may be missing.
    let stream = concat!(
        "data: {\"type\":\"response.reasoning_summary_text.delta\",\"delta\":\"Plan\",\"summary_index\":0}\n\n",
        "event: response.reasoning_text.delta\ndata: {\"type\":\"response.reasoning_text.delta\",\"delta\":\" more\"}\n\n",
        "event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"item_id\":\"fc_1\",\"output_index\":1,\"delta\":\"{\\\"a\\\":\"}\n\n",
        "event: response.refusal.delta\ndata: {\"type\":\"response.refusal.delta\",\"delta\":\"No.\"}\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"\"}\n\n",
        "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"usage\":{\"input_tokens\":3,\"output_tokens\":16}}}\n\n",
    );
    let (events, _) = parse_all_splits(Family::OpenAiResponses, stream.as_bytes());
    assert_eq!(
        events,
        vec![
            Ev::Reasoning("Plan".to_owned()),
            Ev::Reasoning(" more".to_owned()),
            Ev::Tool("{\"a\":".to_owned()),
            text("No."),
            Ev::Usage(Some(3), Some(16)),
            Ev::Terminal
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Anthropic

#[test]
fn anthropic_literal_stream() {
    let bytes = fixture("anthropic.sse");
    let (events, ending) = parse_all_splits(Family::Anthropic, &bytes);
    // message_start gives the input only: its output_tokens (1) is a placeholder.
    assert_eq!(
        events,
        vec![
            Ev::Usage(Some(25), None),
            text("Hello"),
            text(" world"),
            Ev::Usage(None, Some(15)),
            Ev::Terminal
        ]
    );
    assert_eq!(ending, Ending::Clean);
    let outcome = measure(Family::Anthropic, &bytes);
    assert_eq!(outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(outcome.usage_output_tokens, Some(15));
    assert_eq!(outcome.input_tokens, Some(25));
}

#[test]
fn anthropic_thinking_and_tool_use_stream() {
    let (events, _) = parse_all_splits(Family::Anthropic, &fixture("anthropic_thinking_tool.sse"));
    // signature_delta and the `""` first input_json_delta are not content.
    assert_eq!(
        events,
        vec![
            Ev::Usage(Some(472), None),
            Ev::Reasoning("Need weather.".to_owned()),
            Ev::Tool("{\"location\": \"Paris\"}".to_owned()),
            Ev::Usage(None, Some(89)),
            Ev::Terminal
        ]
    );
}

#[test]
fn anthropic_error_event_and_missing_message_stop() {
    let bytes = fixture("anthropic.sse");
    let text_so_far = String::from_utf8(bytes.clone()).expect("utf-8");
    let cut = text_so_far
        .find("event: content_block_stop")
        .expect("fixture has it");
    let mut stream = bytes[..cut].to_vec();
    stream.extend_from_slice(b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"},\"request_id\":\"req_1\"}\n\n");
    let (events, _) = parse_all_splits(Family::Anthropic, &stream);
    assert_eq!(events.last(), Some(&Ev::Error("Overloaded".to_owned())));
    assert_eq!(
        measure(Family::Anthropic, &stream).kind,
        OutcomeKind::Failed(FailureKind::ErrorFrame)
    );

    let without_stop =
        &bytes[..bytes.len() - "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".len()];
    let (events, ending) = parse_all_splits(Family::Anthropic, without_stop);
    assert!(!events.contains(&Ev::Terminal));
    assert_eq!(ending, Ending::Clean);
    assert_eq!(
        measure(Family::Anthropic, without_stop).kind,
        OutcomeKind::EndedEarly
    );
}

// ---------------------------------------------------------------------------------------------
// Ollama native

#[test]
fn ollama_chat_and_generate_literal_streams() {
    let bytes = fixture("ollama_chat.ndjson");
    let (events, ending) = parse_all_splits(Family::Ollama, &bytes);
    assert_eq!(
        events,
        vec![
            text("Hello"),
            text(" world"),
            Ev::Usage(Some(11), Some(18)),
            Ev::Terminal
        ]
    );
    assert_eq!(ending, Ending::Clean);
    let outcome = measure(Family::Ollama, &bytes);
    assert_eq!(outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(outcome.usage_output_tokens, Some(18));

    let (events, _) = parse_all_splits(Family::Ollama, &fixture("ollama_generate.ndjson"));
    assert_eq!(
        events,
        vec![text("Hello"), Ev::Usage(Some(11), Some(18)), Ev::Terminal]
    );
}

#[test]
fn ollama_mid_stream_error_and_missing_done() {
    let bytes = fixture("ollama_chat.ndjson");
    let first_two: Vec<u8> = bytes
        .split_inclusive(|&b| b == b'\n')
        .take(2)
        .flatten()
        .copied()
        .collect();
    let mut with_error = first_two.clone();
    with_error
        .extend_from_slice(b"{\"error\":\"an error was encountered while running the model\"}\n");
    let (events, ending) = parse_all_splits(Family::Ollama, &with_error);
    assert_eq!(
        events,
        vec![
            text("Hello"),
            text(" world"),
            Ev::Error("an error was encountered while running the model".to_owned())
        ]
    );
    assert_eq!(ending, Ending::Clean);
    assert_eq!(
        measure(Family::Ollama, &with_error).kind,
        OutcomeKind::Failed(FailureKind::ErrorFrame)
    );

    let (events, ending) = parse_all_splits(Family::Ollama, &first_two);
    assert!(!events.contains(&Ev::Terminal));
    assert_eq!(ending, Ending::Clean);
    assert_eq!(
        measure(Family::Ollama, &first_two).kind,
        OutcomeKind::EndedEarly
    );

    // A line cut mid-way.
    let cut = &bytes[..first_two.len() + 40];
    let (events, ending) = parse_reads(Family::Ollama, [cut]).expect("valid so far");
    assert_eq!(events, vec![text("Hello"), text(" world")]);
    assert_eq!(ending, Ending::TrailingPartialFrame);
}

#[test]
fn ollama_thinking_blank_lines_crlf_and_unterminated_last_object() {
    let stream = concat!(
        "{\"model\":\"qwen3\",\"created_at\":\"2025-10-26T17:15:24.09776Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"\\u003cplan\\u003e\"},\"done\":false}\r\n",
        "\n",
        "{\"model\":\"qwen3\",\"created_at\":\"2025-10-26T17:15:24.1Z\",\"message\":{\"role\":\"assistant\",\"content\":\"A \\u0026 B\"},\"done\":false}\n",
        "{\"model\":\"qwen3\",\"created_at\":\"2025-10-26T17:15:24.2Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"eval_count\":2}",
    );
    let (events, ending) = parse_all_splits(Family::Ollama, stream.as_bytes());
    // `prompt_eval_count` absent (fully cached prompt) is 0. The last object has no `\n`
    // (as Go's `c.JSON` writes `load` replies) but is whole, so it counts.
    assert_eq!(
        events,
        vec![
            Ev::Reasoning("<plan>".to_owned()),
            text("A & B"),
            Ev::Usage(Some(0), Some(2)),
            Ev::Terminal
        ]
    );
    assert_eq!(ending, Ending::Clean);
}

// ---------------------------------------------------------------------------------------------
// Bedrock

#[test]
fn bedrock_literal_converse_delta_frame() {
    let bytes = hex_fixture("bedrock_converse_delta.hex");
    assert_eq!(bytes.len(), 0x94);
    let (events, ending) = parse_all_splits(Family::BedrockConverse, &bytes);
    assert_eq!(events, vec![text("Hi")]);
    assert_eq!(ending, Ending::Clean);
    // Our test encoder produces the reference bytes.
    assert_eq!(
        bedrock_event(
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"text":"Hi"}}"#
        ),
        bytes
    );
}

#[test]
fn bedrock_literal_exception_frame() {
    let mut stream = hex_fixture("bedrock_converse_delta.hex");
    stream.extend(hex_fixture("bedrock_exception.hex"));
    for family in [Family::BedrockConverse, Family::BedrockInvoke] {
        let (events, ending) = parse_all_splits(family, &stream);
        let expected_error = Ev::Error(
            "throttlingException: Too many requests, please wait before trying again.".to_owned(),
        );
        assert_eq!(events.last(), Some(&expected_error), "{family:?}");
        assert_eq!(ending, Ending::Clean);
        assert_eq!(
            measure(family, &stream).kind,
            OutcomeKind::Failed(FailureKind::ErrorFrame)
        );
    }
}

fn converse_stream(with_metadata: bool) -> Vec<u8> {
    let mut stream = Vec::new();
    stream.extend(bedrock_event(
        "messageStart",
        r#"{"p":"abcdefg","role":"assistant"}"#,
    ));
    stream.extend(bedrock_event(
        "contentBlockDelta",
        r#"{"contentBlockIndex":0,"delta":{"reasoningContent":{"text":"Hmm"}}}"#,
    ));
    stream.extend(bedrock_event(
        "contentBlockDelta",
        r#"{"contentBlockIndex":0,"delta":{"reasoningContent":{"signature":"c2ln"}}}"#,
    ));
    stream.extend(bedrock_event(
        "contentBlockStop",
        r#"{"contentBlockIndex":0,"p":"abcde"}"#,
    ));
    stream.extend(bedrock_event(
        "contentBlockDelta",
        r#"{"contentBlockIndex":1,"delta":{"text":"Hello"},"p":"abcdefghijklmnopqrst"}"#,
    ));
    stream.extend(bedrock_event(
        "contentBlockDelta",
        r#"{"contentBlockIndex":1,"delta":{"text":" world"},"p":"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123"}"#,
    ));
    stream.extend(bedrock_event(
        "contentBlockStop",
        r#"{"contentBlockIndex":1,"p":"abcdefghijklmnopqrstuvwxyzABCDE"}"#,
    ));
    stream.extend(bedrock_event(
        "contentBlockStart",
        r#"{"contentBlockIndex":2,"start":{"toolUse":{"toolUseId":"tooluse_abc","name":"get_weather"}}}"#,
    ));
    stream.extend(bedrock_event(
        "contentBlockDelta",
        r#"{"contentBlockIndex":2,"delta":{"toolUse":{"input":"{\"location\":"}}}"#,
    ));
    stream.extend(bedrock_event(
        "contentBlockStop",
        r#"{"contentBlockIndex":2}"#,
    ));
    stream.extend(bedrock_event(
        "messageStop",
        r#"{"p":"abcdefghijkl","stopReason":"tool_use"}"#,
    ));
    if with_metadata {
        stream.extend(bedrock_event(
            "metadata",
            r#"{"metrics":{"latencyMs":412},"p":"abcde","usage":{"inputTokens":9,"outputTokens":4,"totalTokens":13}}"#,
        ));
    }
    stream
}

#[test]
fn bedrock_converse_usage_arrives_in_metadata_after_message_stop() {
    let stream = converse_stream(true);
    let (events, ending) = parse_all_splits(Family::BedrockConverse, &stream);
    assert_eq!(
        events,
        vec![
            Ev::Reasoning("Hmm".to_owned()),
            text("Hello"),
            text(" world"),
            Ev::Tool("{\"location\":".to_owned()),
            Ev::Usage(Some(9), Some(4)),
            Ev::Terminal
        ]
    );
    assert_eq!(ending, Ending::Clean);
    let outcome = measure(Family::BedrockConverse, &stream);
    assert_eq!(outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(outcome.usage_output_tokens, Some(4));

    // messageStop but no metadata: not complete (§7 "EOF before metadata").
    let without_metadata = converse_stream(false);
    let (events, ending) = parse_all_splits(Family::BedrockConverse, &without_metadata);
    assert!(!events.contains(&Ev::Terminal));
    assert_eq!(ending, Ending::Clean);
    assert_eq!(
        measure(Family::BedrockConverse, &without_metadata).kind,
        OutcomeKind::EndedEarly
    );

    // metadata without messageStop does not prove the message finished.
    let mut no_stop = Vec::new();
    no_stop.extend(bedrock_event(
        "contentBlockDelta",
        r#"{"delta":{"text":"a"}}"#,
    ));
    no_stop.extend(bedrock_event(
        "metadata",
        r#"{"usage":{"inputTokens":1,"outputTokens":1}}"#,
    ));
    let (events, _) = parse_all_splits(Family::BedrockConverse, &no_stop);
    assert_eq!(events, vec![text("a"), Ev::Usage(Some(1), Some(1))]);

    // A metadata frame cut mid-way is a trailing partial frame.
    let cut = &stream[..stream.len() - 10];
    let (events, ending) = parse_reads(Family::BedrockConverse, [cut]).expect("valid so far");
    assert!(!events.contains(&Ev::Terminal));
    assert_eq!(ending, Ending::TrailingPartialFrame);
}

#[test]
fn bedrock_invoke_literal_chunk_frame() {
    // §4.5's literal frame, rebuilt: its prelude and CRC must match the reference.
    let frame = bedrock_event(
        "chunk",
        r#"{"bytes":"eyJ0eXBlIjoiY29udGVudF9ibG9ja19kZWx0YSIsImluZGV4IjowLCJkZWx0YSI6eyJ0eXBlIjoidGV4dF9kZWx0YSIsInRleHQiOiJIaSJ9fQ==","p":"abcdefgh"}"#,
    );
    assert_eq!(
        frame[..12],
        [
            0x00, 0x00, 0x00, 0xe6, 0x00, 0x00, 0x00, 0x4b, 0x23, 0xb8, 0x75, 0x0e
        ]
    );
    assert_eq!(frame[frame.len() - 4..], [0x8e, 0xc5, 0x6a, 0xe9]);
    let (events, _) = parse_all_splits(Family::BedrockInvoke, &frame);
    assert_eq!(events, vec![text("Hi")]);
}

#[test]
fn bedrock_invoke_runs_anthropic_semantics_with_invocation_metrics() {
    let mut stream = Vec::new();
    for inner in [
        r#"{"type":"message_start","message":{"model":"claude-sonnet-4-5-20250929","id":"msg_bdrk_012GBPzpcoMCLP1b2pcJsSHk","type":"message","role":"assistant","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":1}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" there"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#,
        r#"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":10,"outputTokenCount":15,"invocationLatency":1798,"firstByteLatency":1507}}"#,
    ] {
        stream.extend(invoke_chunk(inner, "abcdefghijklmnopqr"));
    }
    let (events, ending) = parse_all_splits(Family::BedrockInvoke, &stream);
    assert_eq!(
        events,
        vec![
            Ev::Usage(Some(10), None),
            text("Hi"),
            text(" there"),
            Ev::Usage(None, Some(15)),
            Ev::Usage(Some(10), Some(15)),
            Ev::Terminal
        ]
    );
    assert_eq!(ending, Ending::Clean);
    let outcome = measure(Family::BedrockInvoke, &stream);
    assert_eq!(outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(outcome.usage_output_tokens, Some(15));

    // The Anthropic thinking + tool fixture, wrapped as Invoke chunks.
    let mut stream = Vec::new();
    for inner in sse_data_lines(&fixture("anthropic_thinking_tool.sse")) {
        stream.extend(invoke_chunk(&inner, "abc"));
    }
    let (events, _) = parse_all_splits(Family::BedrockInvoke, &stream);
    assert_eq!(content_count(&events), 2);
    assert_eq!(events.last(), Some(&Ev::Terminal));
}

#[test]
fn event_stream_corrupt_crc_is_a_checksum_error() {
    let mut bytes = hex_fixture("bedrock_converse_delta.hex");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    let result = parse_reads(Family::BedrockConverse, [&bytes[..]]);
    assert_eq!(result, Err(FrameError::Checksum));
    let result = parse_reads(Family::BedrockConverse, bytes.chunks(7));
    assert_eq!(result, Err(FrameError::Checksum));
    assert_eq!(
        measure(Family::BedrockConverse, &bytes).kind,
        OutcomeKind::Failed(FailureKind::Transport)
    );
}

#[test]
fn event_stream_oversize_prelude_fails_without_waiting_for_the_bytes() {
    let total = (MAX_EVENT_STREAM_FRAME_BYTES + 1) as u32;
    let mut prelude = Vec::new();
    prelude.extend_from_slice(&total.to_be_bytes());
    prelude.extend_from_slice(&0u32.to_be_bytes());
    let mut crc = flate2::Crc::new();
    crc.update(&prelude);
    prelude.extend_from_slice(&crc.sum().to_be_bytes());
    // Only the 12 prelude bytes are fed: the error comes from them alone.
    let mut parser = StreamParser::new(Family::BedrockConverse);
    let result = parser.feed(&prelude, &mut |_| {});
    assert_eq!(
        result,
        Err(FrameError::FrameTooLarge {
            len: MAX_EVENT_STREAM_FRAME_BYTES + 1,
            cap: MAX_EVENT_STREAM_FRAME_BYTES
        })
    );
    // Also after a valid frame, with the prelude split.
    let mut stream = hex_fixture("bedrock_converse_delta.hex");
    stream.extend_from_slice(&prelude);
    let result = parse_reads(Family::BedrockConverse, stream.chunks(5));
    assert!(matches!(result, Err(FrameError::FrameTooLarge { .. })));
}

// ---------------------------------------------------------------------------------------------
// Cross-family tables

#[test]
fn content_frame_counts_of_every_literal_stream() {
    let cases: [(&str, Family, usize, Option<u64>); 9] = [
        ("openai_chat.sse", Family::OpenAiChat, 2, Some(2)),
        ("openai_tool_calls.sse", Family::OpenAiChat, 3, None),
        (
            "openai_completions.sse",
            Family::OpenAiCompletions,
            2,
            Some(2),
        ),
        ("openai_error.sse", Family::OpenAiChat, 0, None),
        ("openai_responses.sse", Family::OpenAiResponses, 2, Some(2)),
        ("anthropic.sse", Family::Anthropic, 2, Some(15)),
        (
            "anthropic_thinking_tool.sse",
            Family::Anthropic,
            2,
            Some(89),
        ),
        ("ollama_chat.ndjson", Family::Ollama, 2, Some(18)),
        ("ollama_generate.ndjson", Family::Ollama, 1, Some(18)),
    ];
    for (name, family, frames, usage) in cases {
        let outcome = measure(family, &fixture(name));
        assert_eq!(outcome.content_frames, frames as u64, "{name}");
        assert_eq!(outcome.usage_output_tokens, usage, "{name}");
    }
    let outcome = measure(
        Family::BedrockConverse,
        &hex_fixture("bedrock_converse_delta.hex"),
    );
    assert_eq!(outcome.content_frames, 1);
}

#[test]
fn several_events_in_one_read_share_its_timestamp() {
    let bytes = fixture("anthropic.sse");
    // Two reads: everything up to the first delta, then the rest in one read.
    let at = String::from_utf8(bytes.clone())
        .expect("utf-8")
        .find("event: content_block_delta")
        .expect("fixture has it")
        + 10;
    let outcome = measure_frames(
        Family::Anthropic,
        [(100, &bytes[..at]), (250, &bytes[at..])],
    );
    assert_eq!(outcome.kind, OutcomeKind::Succeeded);
    assert_eq!(outcome.content_frames, 2);
    assert_eq!(outcome.ttft_us, Some(250));
    assert_eq!(outcome.ttst_us, Some(0));
}

#[test]
fn detect_from_path_content_type_and_first_bytes() {
    let sse = Some("text/event-stream; charset=utf-8");
    // The path wins.
    assert_eq!(
        detect("/v1/chat/completions", sse, b""),
        Some(Family::OpenAiChat)
    );
    assert_eq!(
        detect(
            "/openai/deployments/x/chat/completions?api-version=2024-10-21",
            None,
            b""
        ),
        Some(Family::OpenAiChat)
    );
    assert_eq!(detect("/api/generate", None, b""), Some(Family::Ollama));
    // A gateway path: content type and first bytes.
    let gateway = "/gateway/route-7";
    let cases: [(&str, Option<&str>, Vec<u8>, Family); 9] = [
        ("chat", sse, fixture("openai_chat.sse"), Family::OpenAiChat),
        (
            "completions",
            sse,
            fixture("openai_completions.sse"),
            Family::OpenAiCompletions,
        ),
        (
            "responses",
            sse,
            fixture("openai_responses.sse"),
            Family::OpenAiResponses,
        ),
        (
            "anthropic",
            sse,
            fixture("anthropic.sse"),
            Family::Anthropic,
        ),
        (
            "ollama",
            Some("application/x-ndjson"),
            fixture("ollama_chat.ndjson"),
            Family::Ollama,
        ),
        (
            "ollama, no type",
            None,
            fixture("ollama_generate.ndjson"),
            Family::Ollama,
        ),
        (
            "converse",
            Some("application/vnd.amazon.eventstream"),
            hex_fixture("bedrock_converse_delta.hex"),
            Family::BedrockConverse,
        ),
        (
            "invoke, no type",
            None,
            invoke_chunk("{}", "p"),
            Family::BedrockInvoke,
        ),
        (
            "chat, no type",
            None,
            b"data:{\"object\":\"chat.completion.chunk\"".to_vec(),
            Family::OpenAiChat,
        ),
    ];
    for (what, content_type, bytes, family) in cases {
        let first = &bytes[..bytes.len().min(120)];
        assert_eq!(detect(gateway, content_type, first), Some(family), "{what}");
    }
    assert_eq!(detect(gateway, sse, b""), None);
    assert_eq!(
        detect(gateway, Some("application/json"), b"{\"id\":1}"),
        None
    );
    assert_eq!(
        family_for_path("/model/m/invoke-with-response-stream"),
        Some(Family::BedrockInvoke)
    );
}

#[test]
fn unstreamed_bodies() {
    let body = br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}"#;
    assert_eq!(
        unstreamed(Family::OpenAiChat, body).expect("JSON"),
        Unstreamed {
            has_content: true,
            usage: Some(Usage {
                input_tokens: Some(9),
                output_tokens: Some(1),
                cached_input_tokens: None
            }),
            error: None
        }
    );
    let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}}]}"#;
    assert!(
        unstreamed(Family::OpenAiChat, body)
            .expect("JSON")
            .has_content
    );
    let body =
        br#"{"choices":[{"text":"","index":0}],"usage":{"prompt_tokens":1,"completion_tokens":0}}"#;
    assert!(
        !unstreamed(Family::OpenAiCompletions, body)
            .expect("JSON")
            .has_content
    );
    let body = br#"{"error":{"message":"bad key","type":"invalid_request_error"}}"#;
    assert_eq!(
        unstreamed(Family::OpenAiChat, body)
            .expect("JSON")
            .error
            .as_deref(),
        Some("bad key")
    );

    let body = br#"{"id":"resp_1","object":"response","status":"completed","error":null,"output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}],"usage":{"input_tokens":3,"output_tokens":1}}"#;
    let read = unstreamed(Family::OpenAiResponses, body).expect("JSON");
    assert!(read.has_content && read.error.is_none());
    assert_eq!(read.usage.and_then(|u| u.output_tokens), Some(1));

    let body = br#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"cache_read_input_tokens":10,"output_tokens":2}}"#;
    assert_eq!(
        unstreamed(Family::Anthropic, body).expect("JSON").usage,
        Some(Usage {
            input_tokens: Some(15),
            output_tokens: Some(2),
            cached_input_tokens: Some(10)
        })
    );
    let body = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    assert_eq!(
        unstreamed(Family::Anthropic, body)
            .expect("JSON")
            .error
            .as_deref(),
        Some("Overloaded")
    );

    let body = br#"{"model":"llama3.2","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":"Hi"},"done":true,"done_reason":"stop","eval_count":3}"#;
    assert_eq!(
        unstreamed(Family::Ollama, body).expect("JSON"),
        Unstreamed {
            has_content: true,
            usage: Some(Usage {
                input_tokens: Some(0),
                output_tokens: Some(3),
                cached_input_tokens: None
            }),
            error: None
        }
    );
    let body = br#"{"error":"model \"x\" not found, try pulling it first"}"#;
    assert!(
        unstreamed(Family::Ollama, body)
            .expect("JSON")
            .error
            .is_some()
    );

    let body = br#"{"output":{"message":{"role":"assistant","content":[{"text":"Hi"}]}},"stopReason":"end_turn","usage":{"inputTokens":9,"outputTokens":2,"totalTokens":11},"metrics":{"latencyMs":100}}"#;
    let read = unstreamed(Family::BedrockConverse, body).expect("JSON");
    assert!(read.has_content && read.error.is_none());
    assert_eq!(read.usage.and_then(|u| u.output_tokens), Some(2));
    let body = br#"{"message":"The security token included in the request is invalid."}"#;
    assert!(
        unstreamed(Family::BedrockConverse, body)
            .expect("JSON")
            .error
            .is_some()
    );

    assert!(matches!(
        unstreamed(Family::OpenAiChat, b"<html>502</html>"),
        Err(FrameError::Malformed { .. })
    ));
}

#[test]
fn unescaped_content_text_is_borrowed_not_copied() {
    // The hot path hands out text borrowed from the framing buffers; an owned string would
    // mean an allocation per frame.
    let mut invoke = Vec::new();
    for inner in sse_data_lines(&fixture("anthropic.sse")) {
        invoke.extend(invoke_chunk(&inner, "abc"));
    }
    let cases: [(Family, Vec<u8>); 7] = [
        (Family::OpenAiChat, fixture("openai_chat.sse")),
        (Family::OpenAiCompletions, fixture("openai_completions.sse")),
        (Family::OpenAiResponses, fixture("openai_responses.sse")),
        (Family::Anthropic, fixture("anthropic.sse")),
        (Family::Ollama, fixture("ollama_chat.ndjson")),
        (Family::BedrockConverse, converse_stream(true)),
        (Family::BedrockInvoke, invoke),
    ];
    for (family, bytes) in cases {
        for reads in [bytes.chunks(bytes.len()), bytes.chunks(7)] {
            let mut parser = StreamParser::new(family);
            let (mut borrowed, mut owned) = (0, 0);
            let mut count = |event: Event<'_>| match event {
                Event::Content {
                    text: std::borrow::Cow::Borrowed(_),
                    ..
                } => borrowed += 1,
                // Only text that needed JSON escapes (like the tool input `{\"location\":`)
                // may be owned.
                Event::Content { text, .. } if !text.contains(['"', '\\', '\n']) => owned += 1,
                Event::Content { .. } => {}
                _ => {}
            };
            for read in reads {
                parser.feed(read, &mut count).expect("valid stream");
            }
            parser.finish(&mut count);
            assert!(borrowed >= 2, "{family:?}: {borrowed} borrowed");
            assert_eq!(owned, 0, "{family:?}");
        }
    }
}

#[test]
fn corrupted_streams_never_panic() {
    // Deterministic xorshift: flip bytes of every fixture, cut it at random places, feed the
    // pieces to every family's parser. Errors are fine; panics are not.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut sources = vec![
        fixture("openai_chat.sse"),
        fixture("openai_responses.sse"),
        fixture("anthropic_thinking_tool.sse"),
        fixture("ollama_chat.ndjson"),
        converse_stream(true),
        invoke_chunk(r#"{"type":"message_stop"}"#, "p"),
    ];
    sources.push(sources.concat());
    let families = [
        Family::OpenAiChat,
        Family::OpenAiCompletions,
        Family::OpenAiResponses,
        Family::Anthropic,
        Family::Ollama,
        Family::BedrockConverse,
        Family::BedrockInvoke,
    ];
    let mut errors = 0;
    for source in &sources {
        for _ in 0..40 {
            let mut bytes = source.clone();
            for _ in 0..(next() % 4) {
                let at = (next() as usize) % bytes.len();
                bytes[at] = next() as u8;
            }
            for family in families {
                let mut parser = StreamParser::new(family);
                let mut rest = &bytes[..];
                while !rest.is_empty() {
                    let take = 1 + (next() as usize) % rest.len().min(64);
                    if parser.feed(&rest[..take], &mut |_| {}).is_err() {
                        errors += 1;
                        break;
                    }
                    rest = &rest[take..];
                }
                parser.finish(&mut |_| {});
                let _ = detect("/x", None, &bytes);
                let _ = unstreamed(family, &bytes);
            }
        }
    }
    // Feeding a stream to the wrong family's parser must be refused, not silently accepted.
    assert!(errors > 0);
}
