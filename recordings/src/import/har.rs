//! HAR 1.2 → exchanges: each `log.entries[]` item's request (method, URL path and query,
//! headers, `postData.text`) and response (status, headers, `content.text`, base64 when
//! `content.encoding` says so).
//!
//! HAR has no per-read timing, so frames carry no `t_ms`; `timings.wait` (the time to first
//! byte, when present and not -1) is kept as `response.ttfb_ms` and the entry's `time` as
//! `response.duration_ms`. `startedDateTime` gives `at_ms` (offset from the earliest entry).

use std::collections::BTreeMap;

use base64::Engine;
use common::recording::{Frame, Request, Response, SourceNote};
use serde_json::{Map, Value, json};

use super::azure::parse_timestamp_ticks;
use super::{ImportError, ImportFormat, Sink, Source, exchange};
use common::formats::complete::{CompletionTracker, split_body};

/// Import `source` into `sink`.
pub fn import(source: &Source, sink: &mut Sink) -> Result<(), ImportError> {
    let reader = source.open()?;
    let har: Value = serde_json::from_reader(reader).map_err(|e| {
        source.invalid(
            e.line() as u64,
            "(file)",
            format!("not a HAR JSON document: {e}"),
        )
    })?;
    let entries = har["log"]["entries"]
        .as_array()
        .ok_or_else(|| source.invalid(1, "log.entries", "expected an array of entries"))?;
    let started: Vec<Option<i64>> = entries
        .iter()
        .map(|e| e["startedDateTime"].as_str().and_then(parse_iso_ticks))
        .collect();
    let earliest = started.iter().flatten().min().copied();
    for (i, entry) in entries.iter().enumerate() {
        if !sink.wants_more() {
            break;
        }
        let field = |name: &str| format!("log.entries[{i}].{name}");
        let req = &entry["request"];
        let url = req["url"]
            .as_str()
            .ok_or_else(|| source.invalid(0, field("request.url"), "expected a URL"))?;
        let method = req["method"]
            .as_str()
            .ok_or_else(|| source.invalid(0, field("request.method"), "expected a method"))?
            .to_ascii_uppercase();
        let mut request = Request {
            method,
            path: path_of(url),
            headers: har_headers(&req["headers"], super::dropped_request_header),
            body: None,
            body_b64: None,
            unknown: Map::new(),
        };
        if let Some(text) = req["postData"]["text"].as_str() {
            request.set_body(text.as_bytes());
            if let Some(mime) = req["postData"]["mimeType"].as_str() {
                request
                    .headers
                    .entry("content-type".to_owned())
                    .or_insert_with(|| mime.to_owned());
            }
        }
        let res = &entry["response"];
        let mut ex = exchange(request);
        ex.at_ms = match (started[i], earliest) {
            (Some(t), Some(zero)) => Some((t - zero) as f64 / 10_000.0),
            _ => None,
        };
        ex.set_source_note(&SourceNote {
            entry: Some(i as u64),
            ..SourceNote::new(ImportFormat::Har.name())
        });
        if let Some(status) = res["status"].as_u64().and_then(|s| u16::try_from(s).ok())
            && status > 0
        {
            let mut headers = har_headers(&res["headers"], super::dropped_response_header);
            let content = &res["content"];
            if let Some(mime) = content["mimeType"].as_str().filter(|m| !m.is_empty()) {
                headers
                    .entry("content-type".to_owned())
                    .or_insert_with(|| mime.to_owned());
            }
            let body = match content["text"].as_str() {
                Some(text) if content["encoding"].as_str() == Some("base64") => {
                    base64::engine::general_purpose::STANDARD
                        .decode(text)
                        .map_err(|e| {
                            source.invalid(
                                0,
                                field("response.content.text"),
                                format!("not base64: {e}"),
                            )
                        })?
                }
                Some(text) => text.as_bytes().to_vec(),
                None => Vec::new(),
            };
            let content_type = headers.get("content-type").cloned();
            let chunks = split_body(content_type.as_deref(), &body);
            let mut tracker = CompletionTracker::new(&ex.request.path, content_type.as_deref());
            for chunk in &chunks {
                tracker.feed(chunk);
            }
            let mut unknown = Map::new();
            if let Some(wait) = entry["timings"]["wait"].as_f64().filter(|w| *w >= 0.0) {
                unknown.insert("ttfb_ms".into(), json!(wait));
            }
            if let Some(time) = entry["time"].as_f64().filter(|t| *t >= 0.0) {
                unknown.insert("duration_ms".into(), json!(time));
            }
            ex.response = Some(Response {
                status,
                headers,
                frames: chunks.iter().map(|c| Frame::from_bytes(None, c)).collect(),
                complete: tracker.finish(),
                unknown,
            });
        }
        sink.emit(&ex)?;
    }
    Ok(())
}

fn path_of(url: &str) -> String {
    let rest = match url.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |slash| &rest[slash..]),
        None => url,
    };
    let rest = rest.split('#').next().unwrap_or(rest);
    if rest.starts_with('/') {
        rest.to_owned()
    } else {
        format!("/{rest}")
    }
}

fn har_headers(value: &Value, dropped: fn(&str) -> bool) -> BTreeMap<String, String> {
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for header in value.as_array().map(Vec::as_slice).unwrap_or_default() {
        let (Some(name), Some(value)) = (header["name"].as_str(), header["value"].as_str()) else {
            continue;
        };
        // HTTP/2 pseudo-headers (`:authority`) are not headers to replay.
        if name.starts_with(':') || dropped(name) {
            continue;
        }
        headers
            .entry(name.to_ascii_lowercase())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(value);
            })
            .or_insert_with(|| value.to_owned());
    }
    headers
}

/// ISO 8601 with an optional `Z` or `±HH:MM` offset → 100 ns ticks (UTC).
fn parse_iso_ticks(text: &str) -> Option<i64> {
    let text = text.trim();
    let time_start = text.find('T')?;
    let (base, offset_ticks) = match text[time_start..].rfind(['+', '-']) {
        Some(at) => {
            let at = time_start + at;
            let offset = &text[at + 1..];
            let (h, m) = offset
                .split_once(':')
                .unwrap_or((offset.get(..2)?, offset.get(2..)?));
            let minutes = h.parse::<i64>().ok()? * 60 + m.parse::<i64>().ok()?;
            let sign = if text.as_bytes()[at] == b'+' { 1 } else { -1 };
            (&text[..at], sign * minutes * 60 * 10_000_000)
        }
        None => (text, 0),
    };
    Some(parse_timestamp_ticks(base)? - offset_ticks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_offsets_are_applied() {
        let utc = parse_iso_ticks("2024-05-01T10:00:00.500Z").expect("utc");
        let plus = parse_iso_ticks("2024-05-01T12:00:00.500+02:00").expect("offset");
        assert_eq!(utc, plus);
        assert_eq!(
            path_of("https://api.openai.com/v1/chat/completions?x=1"),
            "/v1/chat/completions?x=1"
        );
    }
}
