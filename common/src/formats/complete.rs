//! Whether a response reached its end: for a stream, the family's terminal marker (never
//! merely a closed connection); for a non-streamed body, a whole JSON document.
//!
//! Shared by the recording proxy (fed read by read) and the importers (fed recorded bodies).

use super::{Event, Family, StreamParser, detect, family_for_path, is_streaming_content_type};

/// The largest non-streamed body kept to check that it is whole JSON.
const MAX_CHECKED_BODY: usize = 64 << 20;

/// Tracks one response's bytes and says at the end whether it was complete.
pub struct CompletionTracker {
    path: String,
    content_type: Option<String>,
    streaming: bool,
    parser: Option<StreamParser>,
    /// Bytes seen before a family could be recognised (unknown paths), or the whole body of a
    /// non-streamed response.
    pending: Vec<u8>,
    terminal: bool,
    error: bool,
    broken: bool,
}

impl CompletionTracker {
    /// A tracker for the response to a request on `path` with this `content-type`.
    pub fn new(path: &str, content_type: Option<&str>) -> CompletionTracker {
        let streaming = content_type.is_some_and(is_streaming_content_type);
        CompletionTracker {
            path: path.to_owned(),
            content_type: content_type.map(str::to_owned),
            streaming,
            parser: None,
            pending: Vec::new(),
            terminal: false,
            error: false,
            broken: false,
        }
    }

    /// Feed the bytes of one read.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.broken {
            return;
        }
        if !self.streaming {
            if self.pending.len() + bytes.len() <= MAX_CHECKED_BODY {
                self.pending.extend_from_slice(bytes);
            } else {
                self.broken = true;
            }
            return;
        }
        if self.parser.is_none() {
            self.pending.extend_from_slice(bytes);
            match detect(&self.path, self.content_type.as_deref(), &self.pending) {
                Some(family) => {
                    self.parser = Some(StreamParser::new(family));
                    let pending = std::mem::take(&mut self.pending);
                    self.parse(&pending);
                }
                None if self.pending.len() > 8 << 10 => self.broken = true,
                None => {}
            }
            return;
        }
        self.parse(bytes);
    }

    fn parse(&mut self, bytes: &[u8]) {
        let Some(parser) = self.parser.as_mut() else {
            return;
        };
        let (terminal, error) = (&mut self.terminal, &mut self.error);
        let result = parser.feed(bytes, &mut |event| match event {
            Event::Terminal => *terminal = true,
            Event::Error { .. } => *error = true,
            _ => {}
        });
        if result.is_err() {
            self.broken = true;
        }
    }

    /// The family recognised so far, if any.
    pub fn family(&self) -> Option<Family> {
        if self.streaming {
            self.parser.as_ref().map(|_| {
                detect(&self.path, self.content_type.as_deref(), &[]).unwrap_or(Family::OpenAiChat)
            })
        } else {
            family_for_path(&self.path)
        }
    }

    /// The response ended (the body was read to its end without a transport error): was it
    /// complete?
    pub fn finish(mut self) -> bool {
        if self.broken {
            return false;
        }
        if !self.streaming {
            return !self.pending.is_empty()
                && serde_json::from_slice::<serde::de::IgnoredAny>(&self.pending).is_ok();
        }
        if let Some(parser) = self.parser.as_mut() {
            let terminal = &mut self.terminal;
            parser.finish(&mut |event| {
                if matches!(event, Event::Terminal) {
                    *terminal = true;
                }
            });
        }
        self.terminal
    }
}

/// Split a whole recorded body into the frames a client would have read: one per SSE event,
/// one per NDJSON line, otherwise one frame for the whole body.
pub fn split_body(content_type: Option<&str>, body: &[u8]) -> Vec<Vec<u8>> {
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let mut frames = Vec::new();
    match media.as_str() {
        "text/event-stream" => {
            let mut start = 0;
            let mut i = 0;
            while i < body.len() {
                if body[i..].starts_with(b"\r\n\r\n") {
                    frames.push(body[start..i + 4].to_vec());
                    i += 4;
                    start = i;
                } else if body[i..].starts_with(b"\n\n") {
                    frames.push(body[start..i + 2].to_vec());
                    i += 2;
                    start = i;
                } else {
                    i += 1;
                }
            }
            if start < body.len() {
                frames.push(body[start..].to_vec());
            }
        }
        "application/x-ndjson" | "application/ndjson" => {
            for line in body.split_inclusive(|b| *b == b'\n') {
                frames.push(line.to_vec());
            }
        }
        _ if !body.is_empty() => frames.push(body.to_vec()),
        _ => {}
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_marker_makes_a_stream_complete() {
        let body = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
        let frames = split_body(Some("text/event-stream; charset=utf-8"), body);
        assert_eq!(frames.len(), 2);
        let mut t = CompletionTracker::new("/v1/chat/completions", Some("text/event-stream"));
        for f in &frames {
            t.feed(f);
        }
        assert!(t.finish());
        let mut cut = CompletionTracker::new("/v1/chat/completions", Some("text/event-stream"));
        cut.feed(&frames[0]);
        assert!(!cut.finish());
        let mut json = CompletionTracker::new("/v1/chat/completions", Some("application/json"));
        json.feed(b"{\"a\":");
        json.feed(b"1}");
        assert!(json.finish());
    }
}
