//! proxymock RRPairs → exchanges: the JSON-lines form (`msgType: rrpair`, `http.req`,
//! `http.res` with `bodyBase64`) and the markdown `.md` form (`### REQUEST (TEST) ###`,
//! `### RESPONSE ###`, `### METADATA ###` sections; FILE may be one `.md` file or a folder of
//! them).
//!
//! proxymock stores a streamed body as one blob: it becomes frames (one per SSE event or
//! NDJSON line) *without* `t_ms`. `duration` (ms) is kept as `response.duration_ms`, the
//! exchange's total latency; `ts` gives `at_ms` (offset from the earliest). proxymock's
//! `session` field is derived from the API key, so it is never copied.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use base64::Engine;
use common::recording::{Exchange, Frame, Request, Response, SourceNote};
use serde_json::{Map, Value, json};

use super::azure::parse_timestamp_ticks;
use super::{ImportError, ImportFormat, Sink, Source, exchange};
use common::formats::complete::{CompletionTracker, split_body};

/// One RRPair, whatever its source form.
struct Pair {
    ts_ticks: Option<i64>,
    id: Option<String>,
    request: Request,
    status: u16,
    response_headers: BTreeMap<String, String>,
    response_body: Option<Vec<u8>>,
    duration_ms: Option<f64>,
}

/// Import `source` (JSON lines, a `.md` file, or a folder of `.md` files) into `sink`.
pub fn import(source: &Source, sink: &mut Sink) -> Result<(), ImportError> {
    let markdown: Vec<PathBuf> = if source.path.is_dir() {
        let mut files = Vec::new();
        collect_md(&source.path, &mut files).map_err(|e| source.read_error(0, e))?;
        files.sort();
        files
    } else if source
        .path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("md"))
    {
        vec![source.path.clone()]
    } else {
        Vec::new()
    };
    let mut pairs = Vec::new();
    if markdown.is_empty() {
        let reader = source.open()?;
        for (index, line) in reader.lines().enumerate() {
            let line_no = index as u64 + 1;
            let line = line.map_err(|e| source.read_error(line_no, e))?;
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(&line)
                .map_err(|e| source.invalid(line_no, "(line)", format!("not JSON: {e}")))?;
            if value
                .get("msgType")
                .and_then(Value::as_str)
                .is_some_and(|t| t != "rrpair")
            {
                continue;
            }
            pairs.push(json_pair(source, line_no, &value)?);
        }
    } else {
        for path in markdown {
            let text = std::fs::read_to_string(&path).map_err(|e| ImportError::Open {
                path: path.clone(),
                source: e,
            })?;
            let md_source = Source { path: path.clone() };
            pairs.push(markdown_pair(&md_source, &text)?);
        }
    }
    // proxymock files hold a handful of pairs each: ordering them by time in memory is fine.
    pairs.sort_by_key(|p| p.ts_ticks.unwrap_or(i64::MAX));
    let earliest = pairs.iter().filter_map(|p| p.ts_ticks).min();
    for pair in pairs {
        if !sink.wants_more() {
            break;
        }
        sink.emit(&to_exchange(pair, earliest))?;
    }
    Ok(())
}

fn collect_md(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_md(&path, out)?;
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("md"))
        {
            out.push(path);
        }
    }
    Ok(())
}

fn to_exchange(pair: Pair, earliest: Option<i64>) -> Exchange {
    let mut ex = exchange(pair.request);
    ex.id = pair.id;
    ex.at_ms = match (pair.ts_ticks, earliest) {
        (Some(t), Some(zero)) => Some((t - zero) as f64 / 10_000.0),
        _ => None,
    };
    let content_type = pair
        .response_headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.clone());
    let body = pair.response_body.unwrap_or_default();
    let chunks = split_body(content_type.as_deref(), &body);
    let mut tracker = CompletionTracker::new(&ex.request.path, content_type.as_deref());
    for chunk in &chunks {
        tracker.feed(chunk);
    }
    let mut unknown = Map::new();
    if let Some(duration) = pair.duration_ms {
        unknown.insert("duration_ms".into(), json!(duration));
    }
    ex.response = Some(Response {
        status: pair.status,
        headers: pair.response_headers,
        frames: chunks.iter().map(|c| Frame::from_bytes(None, c)).collect(),
        complete: tracker.finish(),
        unknown,
    });
    ex.set_source_note(&SourceNote::new(ImportFormat::Proxymock.name()));
    ex
}

/// Keep a header unless it is connection-level or dropped for this side.
fn keep_header(name: &str, dropped: fn(&str) -> bool) -> bool {
    !dropped(name)
}

/// `/path?query` from a proxymock `uri`/`url`, which may be a full URL.
fn path_of(url: &str) -> String {
    let rest = match url.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |slash| &rest[slash..]),
        None => url,
    };
    if rest.starts_with('/') {
        rest.to_owned()
    } else {
        format!("/{rest}")
    }
}

fn json_headers(value: &Value, dropped: fn(&str) -> bool) -> BTreeMap<String, String> {
    let mut headers = BTreeMap::new();
    if let Some(map) = value.as_object() {
        for (name, values) in map {
            if !keep_header(name, dropped) {
                continue;
            }
            let joined = match values {
                Value::Array(items) => items
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", "),
                Value::String(s) => s.clone(),
                _ => continue,
            };
            headers.insert(name.to_ascii_lowercase(), joined);
        }
    }
    headers
}

fn body_of(
    source: &Source,
    line: u64,
    side: &Value,
    field: &str,
) -> Result<Option<Vec<u8>>, ImportError> {
    if let Some(b64) = side.get("bodyBase64").and_then(Value::as_str) {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| {
                source.invalid(
                    line,
                    format!("{field}.bodyBase64"),
                    format!("not base64: {e}"),
                )
            })?;
        return Ok(Some(bytes));
    }
    Ok(side
        .get("body")
        .and_then(Value::as_str)
        .map(|s| s.as_bytes().to_vec()))
}

fn json_pair(source: &Source, line: u64, value: &Value) -> Result<Pair, ImportError> {
    let req = &value["http"]["req"];
    let res = &value["http"]["res"];
    if !req.is_object() {
        return Err(source.invalid(line, "http.req", "expected an object (an HTTP RRPair)"));
    }
    let url = req["uri"]
        .as_str()
        .or_else(|| req["url"].as_str())
        .or_else(|| value["location"].as_str())
        .ok_or_else(|| source.invalid(line, "http.req.uri", "expected the request path"))?;
    let method = req["method"]
        .as_str()
        .or_else(|| value["command"].as_str())
        .unwrap_or("POST")
        .to_ascii_uppercase();
    let mut request = Request {
        method,
        path: path_of(url),
        headers: json_headers(&req["headers"], super::dropped_request_header),
        body: None,
        body_b64: None,
        unknown: Map::new(),
    };
    if let Some(body) = body_of(source, line, req, "http.req")? {
        request.set_body(&body);
    }
    let status = res["statusCode"]
        .as_u64()
        .or_else(|| value["status"].as_str().and_then(|s| s.parse().ok()))
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| source.invalid(line, "http.res.statusCode", "expected an HTTP status"))?;
    let mut response_headers = json_headers(&res["headers"], super::dropped_response_header);
    if let Some(ct) = res["contentType"].as_str() {
        response_headers
            .entry("content-type".to_owned())
            .or_insert_with(|| ct.to_owned());
    }
    let ts_ticks = value["ts"].as_str().and_then(parse_timestamp_ticks);
    Ok(Pair {
        ts_ticks,
        id: value["uuid"].as_str().map(str::to_owned),
        request,
        status,
        response_headers,
        response_body: body_of(source, line, res, "http.res")?,
        duration_ms: value["duration"].as_f64(),
    })
}

/// The sections of a markdown RRPair: name (upper-case, without `#` and the `(TEST)` tag)
/// and the 1-based line where its text starts.
fn sections(text: &str) -> Vec<(String, usize, String)> {
    let mut out: Vec<(String, usize, String)> = Vec::new();
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with("###") && trimmed.len() > 3 {
            let name = trimmed.trim_matches('#').trim().to_ascii_uppercase();
            let name = name
                .split_once(" (")
                .map_or(name.as_str(), |(n, _)| n)
                .to_owned();
            out.push((name, index + 2, String::new()));
        } else if let Some(last) = out.last_mut() {
            last.2.push_str(line);
        }
    }
    out
}

/// Header lines up to the first blank line, then the body (surrounding code fences and the
/// final line break removed).
fn head_and_body(text: &str) -> (Vec<&str>, &str) {
    let text = text.trim_start_matches(['\r', '\n']);
    let text = text.strip_prefix("```\n").unwrap_or(text);
    let (head, body) = match text.find("\n\n").or_else(|| text.find("\r\n\r\n")) {
        Some(at) => (&text[..at], text[at..].trim_start_matches(['\r', '\n'])),
        None => (text, ""),
    };
    let body = body.trim_end_matches(['\r', '\n']);
    let body = body
        .strip_suffix("```")
        .unwrap_or(body)
        .trim_end_matches(['\r', '\n']);
    (
        head.lines().filter(|l| !l.trim().is_empty()).collect(),
        body,
    )
}

fn markdown_pair(source: &Source, text: &str) -> Result<Pair, ImportError> {
    let sections = sections(text);
    let find = |name: &str| sections.iter().find(|(n, _, _)| n == name);
    let (_, req_line, req_text) = find("REQUEST")
        .ok_or_else(|| source.invalid(1, "### REQUEST ###", "no request section"))?;
    let (req_head, req_body) = head_and_body(req_text);
    let request_line = req_head.first().ok_or_else(|| {
        source.invalid(
            *req_line as u64,
            "request line",
            "expected `METHOD URL HTTP/1.1`",
        )
    })?;
    let mut parts = request_line.split_whitespace();
    let (Some(method), Some(url)) = (parts.next(), parts.next()) else {
        return Err(source.invalid(
            *req_line as u64,
            "request line",
            format!("expected `METHOD URL HTTP/1.1`, got {request_line:?}"),
        ));
    };
    let mut request = Request {
        method: method.to_ascii_uppercase(),
        path: path_of(url),
        headers: md_headers(&req_head[1..], super::dropped_request_header),
        body: None,
        body_b64: None,
        unknown: Map::new(),
    };
    if !req_body.is_empty() {
        request.set_body(req_body.as_bytes());
    }
    let mut status = None;
    let mut response_headers = BTreeMap::new();
    let mut response_body = None;
    if let Some((_, _, res_text)) = find("RESPONSE") {
        let (head, body) = head_and_body(res_text);
        let mut head = head.as_slice();
        if let Some(first) = head.first()
            && first.starts_with("HTTP/")
        {
            status = first.split_whitespace().nth(1).and_then(|s| s.parse().ok());
            head = &head[1..];
        }
        response_headers = md_headers(head, super::dropped_response_header);
        // Markdown cannot keep a body's trailing line breaks; a stream's last frame ends
        // with its delimiter, so it is put back.
        let media = response_headers
            .get("content-type")
            .map(|c| {
                c.split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_ascii_lowercase()
            })
            .unwrap_or_default();
        let mut body = body.to_owned();
        if !body.is_empty() {
            match media.as_str() {
                "text/event-stream" => body.push_str("\n\n"),
                "application/x-ndjson" | "application/ndjson" => body.push('\n'),
                _ => {}
            }
        }
        response_body = Some(body.into_bytes());
    }
    let mut ts_ticks = None;
    let mut duration_ms = None;
    let mut id = None;
    if let Some((_, _, meta)) = find("METADATA") {
        for line in meta.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match key.trim().to_ascii_lowercase().as_str() {
                "ts" | "timestamp" => ts_ticks = parse_timestamp_ticks(value),
                "duration" => duration_ms = value.trim_end_matches("ms").trim().parse().ok(),
                "status" | "statuscode" => status = status.or_else(|| value.parse().ok()),
                "uuid" => id = Some(value.to_owned()),
                _ => {}
            }
        }
    }
    Ok(Pair {
        ts_ticks,
        id,
        request,
        status: status.unwrap_or(200),
        response_headers,
        response_body,
        duration_ms,
    })
}

fn md_headers(lines: &[&str], dropped: fn(&str) -> bool) -> BTreeMap<String, String> {
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let name = name.trim();
            if name.is_empty() || !keep_header(name, dropped) {
                continue;
            }
            headers
                .entry(name.to_ascii_lowercase())
                .and_modify(|v| {
                    v.push_str(", ");
                    v.push_str(value.trim());
                })
                .or_insert_with(|| value.trim().to_owned());
        }
    }
    headers
}
