//! Incremental AWS event-stream frame decoder (`application/vnd.amazon.eventstream`, wire
//! reference §4.3), for any byte split.
//!
//! Hand-rolled rather than `aws_smithy_eventstream::frame::MessageFrameDecoder` because that
//! decoder (a) allocates a `Message` with owned headers and payload per frame and (b) checks
//! the prelude CRC only once the whole frame is buffered, so a corrupt or hostile
//! `total_length` makes it wait (and buffer) forever. Here the prelude is validated and the
//! size capped as soon as its 12 bytes arrive; a frame that sits whole inside one read is
//! decoded in place, and a split one is assembled in a reused buffer. The smithy codec is used
//! in the tests as the reference encoder and decoder.

use super::FrameError;

/// Largest frame accepted. botocore allows 24 MiB of payload, real Bedrock frames are a few
/// hundred bytes; 16 MiB is far above anything legitimate.
pub const MAX_EVENT_STREAM_FRAME_BYTES: usize = 16 << 20;

const PRELUDE_BYTES: usize = 12;
const MESSAGE_CRC_BYTES: usize = 4;
const MIN_FRAME_BYTES: usize = PRELUDE_BYTES + MESSAGE_CRC_BYTES;

/// The headers the parsers care about, borrowed from the frame, and its payload.
#[derive(Debug, Default)]
pub(crate) struct EsFrame<'a> {
    /// `:message-type`: `event`, `exception` or `error`.
    pub(crate) message_type: Option<&'a str>,
    /// `:event-type`, e.g. `contentBlockDelta` or `chunk`.
    pub(crate) event_type: Option<&'a str>,
    /// `:exception-type`, e.g. `throttlingException`.
    pub(crate) exception_type: Option<&'a str>,
    /// `:error-code` of a generic error frame.
    pub(crate) error_code: Option<&'a str>,
    /// `:error-message` of a generic error frame.
    pub(crate) error_message: Option<&'a str>,
    /// The payload bytes (JSON for Bedrock).
    pub(crate) payload: &'a [u8],
}

/// The decoder state between reads.
#[derive(Debug, Default)]
pub(crate) struct EventStreamDecoder {
    /// Bytes of the frame being assembled across reads.
    buf: Vec<u8>,
    /// That frame's `total_length` once its prelude was validated, else 0.
    total: usize,
}

impl EventStreamDecoder {
    /// Decode one read, calling `on_frame` for every frame its bytes complete.
    pub(crate) fn feed<F>(&mut self, mut bytes: &[u8], on_frame: &mut F) -> Result<(), FrameError>
    where
        F: FnMut(EsFrame<'_>) -> Result<(), FrameError>,
    {
        loop {
            if self.total == 0 {
                if self.buf.is_empty() {
                    if bytes.len() < PRELUDE_BYTES {
                        self.buf.extend_from_slice(bytes);
                        return Ok(());
                    }
                    let total = check_prelude(&bytes[..PRELUDE_BYTES])?;
                    if bytes.len() >= total {
                        // Fast path: the whole frame is in this read; decode it in place.
                        let (frame, rest) = bytes.split_at(total);
                        decode_frame(frame, on_frame)?;
                        bytes = rest;
                        continue;
                    }
                    self.total = total;
                } else {
                    let take = (PRELUDE_BYTES - self.buf.len()).min(bytes.len());
                    self.buf.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if self.buf.len() < PRELUDE_BYTES {
                        return Ok(());
                    }
                    self.total = check_prelude(&self.buf[..PRELUDE_BYTES])?;
                }
            }
            let take = (self.total - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.buf.len() < self.total {
                return Ok(());
            }
            let result = decode_frame(&self.buf, on_frame);
            self.buf.clear();
            self.total = 0;
            result?;
        }
    }

    /// True when bytes of an unfinished frame are buffered.
    pub(crate) fn has_partial_frame(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Forget any partial frame (after `finish`).
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.total = 0;
    }
}

/// Validate a 12-byte prelude and return the frame's `total_length`.
pub(crate) fn check_prelude(prelude: &[u8]) -> Result<usize, FrameError> {
    let total = read_u32(prelude, 0) as usize;
    let headers_len = read_u32(prelude, 4) as usize;
    // The CRC first: a length from a corrupt prelude means nothing.
    if crc32(&prelude[..8]) != read_u32(prelude, 8) {
        return Err(FrameError::Checksum);
    }
    if total > MAX_EVENT_STREAM_FRAME_BYTES {
        return Err(FrameError::FrameTooLarge {
            len: total,
            cap: MAX_EVENT_STREAM_FRAME_BYTES,
        });
    }
    if total < MIN_FRAME_BYTES || headers_len > total - MIN_FRAME_BYTES {
        return Err(malformed(format!(
            "total_length {total} cannot hold headers_len {headers_len}"
        )));
    }
    Ok(total)
}

/// Check the message CRC of a whole frame and pick out its headers and payload.
fn decode_frame<F>(frame: &[u8], on_frame: &mut F) -> Result<(), FrameError>
where
    F: FnMut(EsFrame<'_>) -> Result<(), FrameError>,
{
    let total = frame.len();
    if crc32(&frame[..total - MESSAGE_CRC_BYTES]) != read_u32(frame, total - MESSAGE_CRC_BYTES) {
        return Err(FrameError::Checksum);
    }
    let headers_len = read_u32(frame, 4) as usize;
    let headers_end = PRELUDE_BYTES + headers_len;
    let mut parsed = parse_headers(&frame[PRELUDE_BYTES..headers_end])?;
    parsed.payload = &frame[headers_end..total - MESSAGE_CRC_BYTES];
    on_frame(parsed)
}

/// The `:event-type` of the first frame in `bytes`, for family detection: `None` when the
/// bytes do not start with a valid prelude or its headers have not all arrived yet.
pub(crate) fn first_event_type(bytes: &[u8]) -> Option<Option<&str>> {
    let prelude = bytes.get(..PRELUDE_BYTES)?;
    check_prelude(prelude).ok()?;
    let headers_len = read_u32(prelude, 4) as usize;
    let headers = bytes.get(PRELUDE_BYTES..PRELUDE_BYTES + headers_len)?;
    Some(parse_headers(headers).ok()?.event_type)
}

/// Pick the headers the parsers care about out of a frame's header block.
fn parse_headers(mut headers: &[u8]) -> Result<EsFrame<'_>, FrameError> {
    let mut parsed = EsFrame::default();
    while !headers.is_empty() {
        let (name, value, rest) = read_header(headers)?;
        headers = rest;
        let Some(value) = value else { continue };
        match name {
            b":message-type" => parsed.message_type = Some(value),
            b":event-type" => parsed.event_type = Some(value),
            b":exception-type" => parsed.exception_type = Some(value),
            b":error-code" => parsed.error_code = Some(value),
            b":error-message" => parsed.error_message = Some(value),
            _ => {}
        }
    }
    Ok(parsed)
}

/// Read one header: its name, its value when it is a string, and the remaining bytes.
type Header<'a> = (&'a [u8], Option<&'a str>, &'a [u8]);

fn read_header(bytes: &[u8]) -> Result<Header<'_>, FrameError> {
    let truncated = || malformed("a header runs past headers_len".to_owned());
    let (&name_len, rest) = bytes.split_first().ok_or_else(truncated)?;
    let name_len = usize::from(name_len);
    if name_len == 0 || rest.len() < name_len + 1 {
        return Err(truncated());
    }
    let (name, rest) = rest.split_at(name_len);
    let (&value_type, rest) = rest.split_first().ok_or_else(truncated)?;
    let fixed = |len: usize| -> Result<&[u8], FrameError> {
        rest.get(len..)
            .ok_or_else(|| malformed("a header runs past headers_len".to_owned()))
    };
    match value_type {
        0 | 1 => Ok((name, None, rest)),      // bool true / false
        2 => Ok((name, None, fixed(1)?)),     // byte
        3 => Ok((name, None, fixed(2)?)),     // short
        4 => Ok((name, None, fixed(4)?)),     // integer
        5 | 8 => Ok((name, None, fixed(8)?)), // long, timestamp
        9 => Ok((name, None, fixed(16)?)),    // uuid
        6 | 7 => {
            if rest.len() < 2 {
                return Err(truncated());
            }
            let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
            let value = rest.get(2..2 + len).ok_or_else(truncated)?;
            let rest = &rest[2 + len..];
            if value_type == 6 {
                return Ok((name, None, rest));
            }
            let value = std::str::from_utf8(value)
                .map_err(|_| malformed("a string header is not UTF-8".to_owned()))?;
            Ok((name, Some(value), rest))
        }
        other => Err(malformed(format!("unknown header value type {other}"))),
    }
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// CRC-32 (IEEE), the event-stream checksum; flate2 (already a dependency) wraps crc32fast.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(bytes);
    crc.sum()
}

fn malformed(reason: String) -> FrameError {
    FrameError::Malformed {
        family: "event-stream",
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};

    fn encode(message: &Message) -> Vec<u8> {
        let mut out = Vec::new();
        aws_smithy_eventstream::frame::write_message_to(message, &mut out).expect("encodable");
        out
    }

    fn event(event_type: &str, payload: &'static [u8]) -> Vec<u8> {
        encode(
            &Message::new(bytes::Bytes::from_static(payload))
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
                )),
        )
    }

    type Owned = (Option<String>, Option<String>, Vec<u8>);

    fn decode(reads: &[&[u8]]) -> Result<(Vec<Owned>, bool), FrameError> {
        let mut decoder = EventStreamDecoder::default();
        let mut frames = Vec::new();
        for read in reads {
            decoder.feed(read, &mut |frame: EsFrame<'_>| {
                frames.push((
                    frame.message_type.map(str::to_owned),
                    frame.event_type.map(str::to_owned),
                    frame.payload.to_vec(),
                ));
                Ok(())
            })?;
        }
        Ok((frames, decoder.has_partial_frame()))
    }

    #[test]
    fn aws_empty_message_test_vector() {
        let empty = [
            0, 0, 0, 0x10, 0, 0, 0, 0, 0x05, 0xc2, 0x48, 0xeb, 0x7d, 0x98, 0xc8, 0xff,
        ];
        let (frames, partial) = decode(&[&empty]).expect("valid frame");
        assert_eq!(frames, vec![(None, None, Vec::new())]);
        assert!(!partial);
    }

    #[test]
    fn every_header_type_is_skipped_correctly() {
        let message = Message::new(bytes::Bytes::from_static(b"{}"))
            .add_header(Header::new("t", HeaderValue::Bool(true)))
            .add_header(Header::new("f", HeaderValue::Bool(false)))
            .add_header(Header::new("b", HeaderValue::Byte(1)))
            .add_header(Header::new("s", HeaderValue::Int16(2)))
            .add_header(Header::new("i", HeaderValue::Int32(3)))
            .add_header(Header::new("l", HeaderValue::Int64(4)))
            .add_header(Header::new(
                "a",
                HeaderValue::ByteArray(bytes::Bytes::from_static(b"xy")),
            ))
            .add_header(Header::new(
                "ts",
                HeaderValue::Timestamp(aws_smithy_types::DateTime::from_secs(5)),
            ))
            .add_header(Header::new("u", HeaderValue::Uuid(6)))
            .add_header(Header::new(
                ":event-type",
                HeaderValue::String("messageStop".into()),
            ));
        let (frames, _) = decode(&[&encode(&message)]).expect("valid frame");
        assert_eq!(
            frames,
            vec![(None, Some("messageStop".to_owned()), b"{}".to_vec())]
        );
    }

    #[test]
    fn frames_split_anywhere_and_batched() {
        let mut stream = event("messageStart", br#"{"role":"assistant"}"#);
        stream.extend(event("contentBlockDelta", br#"{"delta":{"text":"Hi"}}"#));
        let (whole, _) = decode(&[&stream]).expect("valid");
        assert_eq!(whole.len(), 2);
        for i in 0..=stream.len() {
            let (split, partial) = decode(&[&stream[..i], &stream[i..]]).expect("valid");
            assert_eq!(split, whole, "split at {i}");
            assert!(!partial);
        }
        let reads: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(decode(&reads).expect("valid").0, whole);
    }

    #[test]
    fn cut_frame_is_partial() {
        let stream = event("messageStart", br#"{"role":"assistant"}"#);
        for cut in [1, 11, 12, 13, stream.len() - 1] {
            let (frames, partial) = decode(&[&stream[..cut]]).expect("valid so far");
            assert!(frames.is_empty());
            assert!(partial, "cut at {cut}");
        }
    }

    #[test]
    fn corrupt_prelude_crc_and_message_crc() {
        let mut stream = event("messageStart", br#"{"role":"assistant"}"#);
        let last = stream.len() - 1;
        stream[last] ^= 1;
        assert_eq!(decode(&[&stream]), Err(FrameError::Checksum));
        let mut stream = event("messageStart", br#"{"role":"assistant"}"#);
        stream[9] ^= 1;
        // The prelude alone is enough to reject it.
        assert_eq!(decode(&[&stream[..12]]), Err(FrameError::Checksum));
    }

    #[test]
    fn oversize_prelude_is_refused_before_its_bytes_arrive() {
        let mut prelude = Vec::new();
        prelude.extend_from_slice(&(64u32 << 20).to_be_bytes());
        prelude.extend_from_slice(&0u32.to_be_bytes());
        let crc = crc32(&prelude);
        prelude.extend_from_slice(&crc.to_be_bytes());
        assert_eq!(
            decode(&[&prelude[..5], &prelude[5..]]),
            Err(FrameError::FrameTooLarge {
                len: 64 << 20,
                cap: MAX_EVENT_STREAM_FRAME_BYTES
            })
        );
    }

    #[test]
    fn headers_len_past_the_frame_is_malformed() {
        let mut prelude = Vec::new();
        prelude.extend_from_slice(&20u32.to_be_bytes());
        prelude.extend_from_slice(&10u32.to_be_bytes());
        let crc = crc32(&prelude);
        prelude.extend_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            decode(&[&prelude]),
            Err(FrameError::Malformed { .. })
        ));
    }

    #[test]
    fn agrees_with_the_smithy_decoder() {
        use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
        let stream = event(
            "contentBlockDelta",
            br#"{"contentBlockIndex":0,"delta":{"text":"Hi"}}"#,
        );
        let mut smithy = MessageFrameDecoder::new();
        let mut buf = bytes::BytesMut::from(&stream[..]);
        let DecodedFrame::Complete(message) = smithy.decode_frame(&mut buf).expect("valid") else {
            panic!("smithy saw an incomplete frame");
        };
        let (ours, _) = decode(&[&stream]).expect("valid");
        assert_eq!(ours[0].2, message.payload().to_vec());
        assert_eq!(ours[0].1.as_deref(), Some("contentBlockDelta"));
        assert_eq!(ours[0].0.as_deref(), Some("event"));
    }
}
