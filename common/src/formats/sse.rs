//! Incremental WHATWG server-sent-events decoder (wire reference §1.1), for any byte split.
//!
//! It hands each dispatched event to a callback as borrowed bytes. Lines that sit whole inside
//! one read are processed in place; only a line split across reads is copied into `line`, and
//! the `data` value is accumulated in a reused buffer, so after warm-up no frame allocates.

use super::{Ending, FrameError};

/// Largest event (data plus a pending line) we buffer. Real frames are a few KiB; a stream
/// that never sends a line end must not grow memory without bound.
pub(crate) const MAX_SSE_EVENT_BYTES: usize = 16 << 20;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched SSE event.
#[derive(Debug)]
pub(crate) struct SseEvent<'a> {
    /// The `event:` field, `None` when the event had none (the spec default `message`).
    pub(crate) event: Option<&'a str>,
    /// The `data:` lines joined with `\n`.
    pub(crate) data: &'a [u8],
}

/// The decoder state between reads.
#[derive(Debug, Default)]
pub(crate) struct SseDecoder {
    /// Bytes of a line whose end has not arrived yet.
    line: Vec<u8>,
    /// The data buffer of the event being built.
    data: Vec<u8>,
    /// The event type of the event being built (empty = none).
    event: Vec<u8>,
    /// A `data` field was seen since the last dispatch (the spec dispatches only then).
    data_seen: bool,
    /// Any field was seen since the last blank line: at EOF this is a cut event.
    field_seen: bool,
    /// The previous read ended with `\r`: a `\n` starting the next read belongs to it.
    skip_lf: bool,
    /// The first line was seen (the BOM can only precede it).
    started: bool,
}

impl SseDecoder {
    /// Decode one read, calling `on_event` for every event its bytes complete.
    pub(crate) fn feed<F>(&mut self, mut bytes: &[u8], on_event: &mut F) -> Result<(), FrameError>
    where
        F: FnMut(SseEvent<'_>) -> Result<(), FrameError>,
    {
        if self.skip_lf && !bytes.is_empty() {
            self.skip_lf = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(end) = memchr::memchr2(b'\n', b'\r', bytes) {
            let terminator_len = if bytes[end] == b'\r' {
                match bytes.get(end + 1) {
                    Some(b'\n') => 2,
                    Some(_) => 1,
                    None => {
                        // A `\r` ending the read already ends the line (a lone CR is a line
                        // end); dispatch now for an accurate timestamp and swallow a `\n`
                        // that may start the next read.
                        self.skip_lf = true;
                        1
                    }
                }
            } else {
                1
            };
            if self.line.is_empty() {
                self.process_line(&bytes[..end], on_event)?;
            } else {
                // Take the buffer out to borrow it while `self` is mutated; the Vec (and its
                // capacity) is put back, so this does not allocate.
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&bytes[..end]);
                let result = self.process_line(&line, on_event);
                line.clear();
                self.line = line;
                result?;
            }
            bytes = &bytes[end + terminator_len..];
        }
        if !bytes.is_empty() {
            if self.line.len() + self.data.len() + bytes.len() > MAX_SSE_EVENT_BYTES {
                return Err(too_large());
            }
            self.line.extend_from_slice(bytes);
        }
        Ok(())
    }

    /// End of stream: an event without its blank line (or a line without its end) was cut.
    /// Per the spec it is discarded, but it is reported.
    pub(crate) fn finish(&mut self) -> Ending {
        let pending_line = !self.line.is_empty() && self.line != BOM;
        let ending = if pending_line || self.field_seen {
            Ending::TrailingPartialFrame
        } else {
            Ending::Clean
        };
        self.line.clear();
        self.reset_event();
        ending
    }

    fn process_line<F>(&mut self, mut line: &[u8], on_event: &mut F) -> Result<(), FrameError>
    where
        F: FnMut(SseEvent<'_>) -> Result<(), FrameError>,
    {
        if !self.started {
            self.started = true;
            if let Some(rest) = line.strip_prefix(BOM) {
                line = rest;
            }
        }
        if line.is_empty() {
            return self.dispatch(on_event);
        }
        if line[0] == b':' {
            return Ok(()); // comment / keep-alive
        }
        self.field_seen = true;
        let (name, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"data" => {
                if self.data.len() + value.len() + 1 > MAX_SSE_EVENT_BYTES {
                    return Err(too_large());
                }
                if self.data_seen {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.data_seen = true;
            }
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
            }
            // `id`, `retry` and unknown fields do not matter for measuring.
            _ => {}
        }
        Ok(())
    }

    fn dispatch<F>(&mut self, on_event: &mut F) -> Result<(), FrameError>
    where
        F: FnMut(SseEvent<'_>) -> Result<(), FrameError>,
    {
        let result = if self.data_seen {
            match std::str::from_utf8(&self.event) {
                Ok(name) => on_event(SseEvent {
                    event: (!name.is_empty()).then_some(name),
                    data: &self.data,
                }),
                Err(_) => Err(FrameError::Malformed {
                    family: "sse",
                    reason: "event name is not UTF-8".to_owned(),
                }),
            }
        } else {
            Ok(())
        };
        self.reset_event();
        result
    }

    fn reset_event(&mut self) {
        self.data.clear();
        self.event.clear();
        self.data_seen = false;
        self.field_seen = false;
    }
}

fn too_large() -> FrameError {
    FrameError::Malformed {
        family: "sse",
        reason: format!("an event is over {MAX_SSE_EVENT_BYTES} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode `reads` and return `(event, data)` pairs and the ending.
    fn decode(reads: &[&[u8]]) -> (Vec<(Option<String>, String)>, Ending) {
        let mut decoder = SseDecoder::default();
        let mut events = Vec::new();
        for read in reads {
            decoder
                .feed(read, &mut |ev: SseEvent<'_>| {
                    events.push((
                        ev.event.map(str::to_owned),
                        String::from_utf8(ev.data.to_vec()).expect("utf-8 data"),
                    ));
                    Ok(())
                })
                .expect("valid SSE");
        }
        let ending = decoder.finish();
        (events, ending)
    }

    fn one(data: &str) -> (Option<String>, String) {
        (None, data.to_owned())
    }

    #[test]
    fn data_with_and_without_space_and_multiline_join() {
        let (events, ending) = decode(&[b"data: a\ndata:b\ndata:  c\n\n"]);
        assert_eq!(events, vec![one("a\nb\n c")]);
        assert_eq!(ending, Ending::Clean);
    }

    #[test]
    fn all_three_line_endings() {
        let (events, _) = decode(&[b"data: 1\r\n\r\ndata: 2\r\rdata: 3\n\n"]);
        assert_eq!(events, vec![one("1"), one("2"), one("3")]);
    }

    #[test]
    fn cr_at_end_of_read_then_lf() {
        // `\r` | `\n\r\n`: the first `\n` belongs to the `\r`, the `\r\n` is the blank line.
        let (events, ending) = decode(&[b"data: x\r", b"\n\r\n"]);
        assert_eq!(events, vec![one("x")]);
        assert_eq!(ending, Ending::Clean);
        // `\r` | `\r`: two lone CRs are a line end and a blank line.
        let (events, _) = decode(&[b"data: x\r", b"\rdata: y\n\n"]);
        assert_eq!(events, vec![one("x"), one("y")]);
    }

    #[test]
    fn crlf_split_inside_a_multi_line_event() {
        // `\r` | `\n`: the `\n` must not be taken for a blank line, which would dispatch
        // `a` alone and lose the event name.
        let (events, _) = decode(&[b"event: e\r", b"\ndata: a\r", b"\ndata: b\r\n\r\n"]);
        assert_eq!(events, vec![(Some("e".to_owned()), "a\nb".to_owned())]);
    }

    #[test]
    fn bom_comments_event_names_and_fieldless_blocks() {
        let (events, ending) = decode(&[
            b"\xEF\xBB",
            b"\xBFdata: first\n\n: OPENROUTER PROCESSING\n\n:\n\nevent: ping\n\nevent: x\ndata\nid: 7\nretry: 10\nfoo: bar\n\n",
        ]);
        // The BOM is dropped; `event: ping` without data is not dispatched; `data` without a
        // colon is empty data.
        assert_eq!(
            events,
            vec![one("first"), (Some("x".to_owned()), String::new())]
        );
        assert_eq!(ending, Ending::Clean);
    }

    #[test]
    fn unterminated_event_is_reported_not_dispatched() {
        let (events, ending) = decode(&[b"data: a\n\ndata: b\n"]);
        assert_eq!(events, vec![one("a")]);
        assert_eq!(ending, Ending::TrailingPartialFrame);
        let (_, ending) = decode(&[b"data: a\n\ndata: b"]);
        assert_eq!(ending, Ending::TrailingPartialFrame);
        let (_, ending) = decode(&[b": keep-alive\n"]);
        assert_eq!(ending, Ending::Clean);
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut decoder = SseDecoder::default();
        let chunk = vec![b'x'; 1 << 20];
        let mut result = Ok(());
        for _ in 0..17 {
            result = decoder.feed(&chunk, &mut |_| Ok(()));
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(FrameError::Malformed { .. })));
    }
}
