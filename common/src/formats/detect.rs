//! Family recognition from the request path, the response content type and the first bytes.
//!
//! The path is the strongest hint (it chose the API); a gateway's unknown path falls back to
//! the content type, and the first bytes settle what the content type leaves open.

use super::Family;
use super::eventstream;

/// How much of the first bytes the sniffers look at.
const SNIFF_BYTES: usize = 8 << 10;

/// The family a request path belongs to, ignoring any query, fragment, scheme and host, and
/// any prefix (Azure's `/openai/deployments/{name}/chat/completions`, gateway mounts).
///
/// Bedrock's non-streaming `/model/{id}/converse` and `/model/{id}/invoke` map to the same
/// families as their streaming twins, so [`super::unstreamed`] can read their bodies.
pub fn family_for_path(path: &str) -> Option<Family> {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    // A full URL: keep only the path.
    let path = match path.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("", |slash| &rest[slash..]),
        None => path,
    };
    let path = path.trim_end_matches('/');

    if let Some(at) = path.find("/model/") {
        // The model id may be an ARN with (encoded or not) slashes: the operation is the last
        // segment.
        if let Some((model_id, operation)) = path[at + "/model/".len()..].rsplit_once('/')
            && !model_id.is_empty()
        {
            match operation {
                "converse-stream" | "converse" => return Some(Family::BedrockConverse),
                "invoke-with-response-stream" | "invoke" => return Some(Family::BedrockInvoke),
                _ => {}
            }
        }
    }
    if path.ends_with("/chat/completions") {
        Some(Family::OpenAiChat)
    } else if path.ends_with("/completions") {
        Some(Family::OpenAiCompletions)
    } else if path.ends_with("/responses") {
        Some(Family::OpenAiResponses)
    } else if path.ends_with("/messages") && !path.contains("/threads/") {
        // `/threads/{id}/messages` is the OpenAI Assistants API, not Anthropic.
        Some(Family::Anthropic)
    } else if path.ends_with("/api/chat") || path.ends_with("/api/generate") {
        Some(Family::Ollama)
    } else {
        None
    }
}

/// True for the content types of the three stream framings (SSE, NDJSON, AWS event stream),
/// whatever their parameters and case.
pub fn is_streaming_content_type(content_type: &str) -> bool {
    let media = media_type(content_type);
    [
        "text/event-stream",
        "application/x-ndjson",
        "application/ndjson",
        "application/vnd.amazon.eventstream",
    ]
    .iter()
    .any(|known| media.eq_ignore_ascii_case(known))
}

/// Whether a response is a stream of frames (to be timed frame by frame) or one body, decided
/// from what a client sees: the content type when it names a stream framing, else the first
/// bytes (SSE field lines, an event-stream prelude), else the request itself (its `stream`
/// flag, Ollama's default of streaming, Bedrock's streaming operations).
///
/// Gateways often send SSE as `text/plain` or with no content type at all; a JSON first byte
/// is one body unless the request asked an Ollama server to stream (NDJSON).
pub fn response_is_streamed(
    path: &str,
    content_type: Option<&str>,
    request_body: &[u8],
    first_bytes: &[u8],
) -> bool {
    if content_type.is_some_and(is_streaming_content_type) {
        return true;
    }
    let first = first_bytes
        .strip_prefix(b"\xEF\xBB\xBF")
        .unwrap_or(first_bytes);
    let first = &first[..first.len().min(SNIFF_BYTES)];
    let first = first.trim_ascii_start();
    if looks_like_sse(first) || eventstream::first_event_type(first).is_some() {
        return true;
    }
    let family = family_for_path(path);
    if first.starts_with(b"{") || first.starts_with(b"[") {
        return family == Some(Family::Ollama)
            && super::request::asks_stream(
                family,
                path,
                super::request::stream_flag_of(request_body),
            );
    }
    // Nothing in the bytes settles it (an empty first read): what the request asked for.
    super::request::asks_stream(family, path, super::request::stream_flag_of(request_body))
}

/// SSE field lines: `data:`, `event:`, `id:`, `retry:` or a `:` comment.
fn looks_like_sse(bytes: &[u8]) -> bool {
    [&b"data:"[..], b"event:", b"id:", b"retry:", b":"]
        .iter()
        .any(|field| bytes.starts_with(field))
}

pub(crate) fn detect(path: &str, content_type: Option<&str>, first_bytes: &[u8]) -> Option<Family> {
    if let Some(family) = family_for_path(path) {
        return Some(family);
    }
    let first_bytes = &first_bytes[..first_bytes.len().min(SNIFF_BYTES)];
    let media = content_type.map(media_type).unwrap_or_default();
    if media.eq_ignore_ascii_case("application/vnd.amazon.eventstream") {
        return sniff_event_stream(first_bytes);
    }
    if media.eq_ignore_ascii_case("application/x-ndjson")
        || media.eq_ignore_ascii_case("application/ndjson")
    {
        return Some(Family::Ollama);
    }
    if media.eq_ignore_ascii_case("text/event-stream") {
        return sniff_sse(first_bytes);
    }
    // No or an unhelpful content type (a proxy saying `application/octet-stream`): bytes only.
    sniff_event_stream(first_bytes)
        .or_else(|| sniff_ndjson(first_bytes))
        .or_else(|| sniff_sse(first_bytes))
}

fn media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or_default().trim()
}

/// A valid event-stream prelude; the first frame's `:event-type` tells Invoke (`chunk`) from
/// Converse (`messageStart`, …).
fn sniff_event_stream(bytes: &[u8]) -> Option<Family> {
    match eventstream::first_event_type(bytes)? {
        Some("chunk") => Some(Family::BedrockInvoke),
        _ => Some(Family::BedrockConverse),
    }
}

/// Ollama writes Go structs whose first field is `model`.
fn sniff_ndjson(bytes: &[u8]) -> Option<Family> {
    let bytes = bytes.trim_ascii_start();
    let ollama = bytes.starts_with(b"{\"model\":")
        || (bytes.starts_with(b"{")
            && contains(bytes, b"\"created_at\"")
            && contains(bytes, b"\"done\""));
    ollama.then_some(Family::Ollama)
}

/// Look at the first `event:` and `data:` lines of an SSE stream.
fn sniff_sse(bytes: &[u8]) -> Option<Family> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    for line in bytes.split(|&b| b == b'\n' || b == b'\r') {
        if let Some(name) = line.strip_prefix(b"event:") {
            let name = name.trim_ascii();
            if name.starts_with(b"response.") {
                return Some(Family::OpenAiResponses);
            }
            if matches!(
                name,
                b"message_start"
                    | b"content_block_start"
                    | b"content_block_delta"
                    | b"content_block_stop"
                    | b"message_delta"
                    | b"message_stop"
                    | b"ping"
            ) {
                return Some(Family::Anthropic);
            }
        } else if let Some(data) = line.strip_prefix(b"data:")
            && let Some(family) = sniff_sse_data(data)
        {
            return Some(family);
        }
    }
    None
}

fn sniff_sse_data(data: &[u8]) -> Option<Family> {
    // `"type":"<value>` with or without a space after the colon (Python's `json.dumps`).
    let typed = |value: &[u8]| {
        [&b"\"type\":\""[..], &b"\"type\": \""[..]]
            .iter()
            .any(|key| {
                data.windows(key.len() + value.len())
                    .any(|window| window.starts_with(key) && window.ends_with(value))
            })
    };
    if typed(b"response.") {
        Some(Family::OpenAiResponses)
    } else if typed(b"message_") || typed(b"content_block_") {
        Some(Family::Anthropic)
    } else if contains(data, b"chat.completion.chunk") {
        Some(Family::OpenAiChat)
    } else if contains(data, b"\"text_completion\"") {
        Some(Family::OpenAiCompletions)
    } else if contains(data, b"\"prompt_filter_results\"") || contains(data, b"\"choices\"") {
        // Azure's preamble and servers without `object`: the chat parser also reads
        // completion chunks, so this guess is safe.
        Some(Family::OpenAiChat)
    } else {
        None
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let cases = [
            ("/v1/chat/completions", Some(Family::OpenAiChat)),
            ("/chat/completions", Some(Family::OpenAiChat)),
            (
                "/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21",
                Some(Family::OpenAiChat),
            ),
            ("/v1/completions", Some(Family::OpenAiCompletions)),
            (
                "/openai/deployments/x/completions?api-version=1",
                Some(Family::OpenAiCompletions),
            ),
            ("/v1/responses", Some(Family::OpenAiResponses)),
            ("/v1/messages", Some(Family::Anthropic)),
            ("/v1/messages/", Some(Family::Anthropic)),
            ("/v1/threads/t1/messages", None),
            ("/api/chat", Some(Family::Ollama)),
            ("/api/generate", Some(Family::Ollama)),
            (
                "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse-stream",
                Some(Family::BedrockConverse),
            ),
            ("/model/m/converse", Some(Family::BedrockConverse)),
            (
                "/model/arn:aws:bedrock:us-east-1:1:inference-profile/x/invoke-with-response-stream",
                Some(Family::BedrockInvoke),
            ),
            ("/model//converse-stream", None),
            (
                "https://api.openai.com/v1/chat/completions",
                Some(Family::OpenAiChat),
            ),
            ("/v1/models", None),
            ("/", None),
            ("", None),
        ];
        for (path, family) in cases {
            assert_eq!(family_for_path(path), family, "{path}");
        }
    }

    #[test]
    fn streaming_content_types() {
        assert!(is_streaming_content_type(
            "text/event-stream; charset=utf-8"
        ));
        assert!(is_streaming_content_type("Application/X-NDJSON"));
        assert!(is_streaming_content_type(
            "application/vnd.amazon.eventstream"
        ));
        assert!(!is_streaming_content_type("application/json"));
    }
}
