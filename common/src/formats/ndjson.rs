//! Incremental newline-delimited JSON splitter (wire reference §1.2), for any byte split.
//!
//! Lines inside one read are handed out in place; only a line split across reads is copied,
//! into a reused buffer. Blank lines and a `\r` before the `\n` are tolerated (Ollama never
//! writes them, but proxies and hand-written mocks do).

use super::{Ending, FrameError};

/// Largest line we buffer; a stream that never sends `\n` must not grow memory without bound.
pub(crate) const MAX_NDJSON_LINE_BYTES: usize = 16 << 20;

/// The splitter state between reads.
#[derive(Debug, Default)]
pub(crate) struct NdjsonDecoder {
    /// Bytes of a line whose `\n` has not arrived yet.
    line: Vec<u8>,
}

/// What was left at end of stream.
pub(crate) enum Leftover<'a> {
    /// Nothing but whitespace.
    None,
    /// An unterminated, non-blank last line.
    Line(&'a [u8]),
}

impl NdjsonDecoder {
    /// Split one read, calling `on_line` for every non-blank line it completes (without its
    /// line end).
    pub(crate) fn feed<F>(&mut self, mut bytes: &[u8], on_line: &mut F) -> Result<(), FrameError>
    where
        F: FnMut(&[u8]) -> Result<(), FrameError>,
    {
        while let Some(end) = memchr::memchr(b'\n', bytes) {
            if self.line.is_empty() {
                emit(&bytes[..end], on_line)?;
            } else {
                self.line.extend_from_slice(&bytes[..end]);
                let result = emit(&self.line, on_line);
                self.line.clear();
                result?;
            }
            bytes = &bytes[end + 1..];
        }
        if !bytes.is_empty() {
            if self.line.len() + bytes.len() > MAX_NDJSON_LINE_BYTES {
                return Err(FrameError::Malformed {
                    family: "ndjson",
                    reason: format!("a line is over {MAX_NDJSON_LINE_BYTES} bytes"),
                });
            }
            self.line.extend_from_slice(bytes);
        }
        Ok(())
    }

    /// End of stream: the unterminated last line, if any.
    pub(crate) fn leftover(&self) -> Leftover<'_> {
        let line = self.line.trim_ascii();
        if line.is_empty() {
            Leftover::None
        } else {
            Leftover::Line(line)
        }
    }

    /// Forget the leftover (after `finish`).
    pub(crate) fn clear(&mut self) {
        self.line.clear();
    }
}

impl Leftover<'_> {
    /// The ending this leftover means when it is not used as a frame.
    pub(crate) fn ending(&self) -> Ending {
        match self {
            Leftover::None => Ending::Clean,
            Leftover::Line(_) => Ending::TrailingPartialFrame,
        }
    }
}

fn emit<F>(line: &[u8], on_line: &mut F) -> Result<(), FrameError>
where
    F: FnMut(&[u8]) -> Result<(), FrameError>,
{
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.trim_ascii().is_empty() {
        return Ok(());
    }
    on_line(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(reads: &[&[u8]]) -> (Vec<String>, Ending) {
        let mut decoder = NdjsonDecoder::default();
        let mut lines = Vec::new();
        for read in reads {
            decoder
                .feed(read, &mut |line: &[u8]| {
                    lines.push(String::from_utf8(line.to_vec()).expect("utf-8"));
                    Ok(())
                })
                .expect("within the cap");
        }
        let ending = decoder.leftover().ending();
        (lines, ending)
    }

    #[test]
    fn lines_blank_lines_and_crlf() {
        let (lines, ending) = split(&[b"{\"a\":1}\r\n\n  \n{\"b\"", b":2}\n"]);
        assert_eq!(lines, vec!["{\"a\":1}", "{\"b\":2}"]);
        assert_eq!(ending, Ending::Clean);
    }

    #[test]
    fn partial_last_line_is_reported() {
        let (lines, ending) = split(&[b"{\"a\":1}\n{\"b\":"]);
        assert_eq!(lines, vec!["{\"a\":1}"]);
        assert_eq!(ending, Ending::TrailingPartialFrame);
        let (_, ending) = split(&[b"{\"a\":1}\n \r\n  "]);
        assert_eq!(ending, Ending::Clean);
    }
}
