//! The replay's own HTTP/1.1 client for cleartext (`http://`) targets: a pool of keep-alive
//! TCP connections, each read by the request that holds it.
//!
//! A general client (reqwest over hyper) runs each connection as a task of its own and hands
//! every body frame to the request's task through a channel; each connection holds a read
//! buffer of 8–16 KiB, an 8 KiB write buffer and a request channel of about 9 KiB. Here the
//! request's task reads its socket itself: one read, one timestamp, the payload of every
//! chunk that read completed, with no hop between tasks. A connection holds its socket and a
//! read buffer that starts at [`INITIAL_BUFFER`] bytes and grows only when a read fills it
//! (a burst), so ten thousand slow streams cost little more than their sockets.
//!
//! Measured against hyper's own `client::conn::http1`, driven in the request's task with a
//! sized read buffer (a transport since removed; `docs/performance.md`, "One send path"): hyper spent
//! 1.45× the CPU per output token and held 2.5× the memory for 10,000 open streams (its
//! fixed 8 KiB write buffer, its dispatcher and body channel), with no TTFT row clearly
//! better; so this client stays.
//!
//! What it speaks: HTTP/1.1 requests with a `content-length` body, written from the prepared
//! head and the shared body bytes (no copy of the body); responses with a `content-length`,
//! `chunked` (chunk extensions and trailers skipped) or read-until-close body; interim 1xx
//! heads skipped. A connection goes back to the pool only when its response ended exactly
//! at a message boundary and neither side asked to close. HTTPS, HTTP/2, proxies and SigV4
//! stay with reqwest (`client`), which decides per request which client sends it.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A connection's read buffer at first: a response head and a few stream frames.
pub const INITIAL_BUFFER: usize = 2 << 10;
/// The most a read buffer grows to for bursts (a read that fills it doubles it).
const MAX_READ_BUFFER: usize = 64 << 10;
/// The largest response head (status line and headers) accepted.
const MAX_HEAD_BYTES: usize = 64 << 10;
/// The most headers a response head may carry.
const MAX_HEADERS: usize = 128;
/// The longest chunk-size or trailer line accepted.
const MAX_LINE_BYTES: usize = 8 << 10;

/// Why an HTTP/1.1 exchange failed. I/O errors keep their kind (the transport cause is read
/// from it: refused, reset, closed before a response).
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    // Not transparent: the error's source is the I/O error itself, so that
    // `client::classify` sees its kind.
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("invalid response: {0}")]
    Protocol(String),
    /// The server answered the HTTP/1.1 request with HTTP/2 frames (its SETTINGS, a GOAWAY):
    /// it speaks only HTTP/2, here cleartext HTTP/2 with prior knowledge (h2c).
    #[error("the server answered in HTTP/2 (a cleartext HTTP/2-only server: use --target-h2c)")]
    Http2Answer,
}

impl H1Error {
    fn protocol(reason: impl Into<String>) -> H1Error {
        H1Error::Protocol(reason.into())
    }

    /// The connection ended (or was reset) before any byte of the response arrived.
    fn closed_before_response() -> H1Error {
        H1Error::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a response",
        ))
    }
}

/// `http://AUTHORITY/PATH?QUERY` → (authority, request target). `None` for anything this
/// client does not send: another scheme, credentials in the URL, no host.
pub fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("http://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, target) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') || target.contains('#') {
        return None;
    }
    Some((authority, target))
}

/// The address to dial for `authority`: port 80 when it names none.
pub fn dial_address(authority: &str) -> String {
    let has_port = authority
        .rfind(':')
        .is_some_and(|colon| !authority[colon..].contains(']'));
    if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    }
}

/// Keep-alive connections waiting for a request, by authority.
#[derive(Default)]
pub struct Pool {
    idle: Mutex<HashMap<String, Vec<Conn>>>,
}

impl Pool {
    /// A waiting connection to `authority` that is still open, if any.
    pub fn take(&self, authority: &str) -> Option<Conn> {
        loop {
            let mut conn = lock(&self.idle).get_mut(authority)?.pop()?;
            if conn.still_open() {
                return Some(conn);
            }
        }
    }

    /// Keep `conn` for a later request to `authority`.
    pub fn put(&self, authority: &str, conn: Conn) {
        let mut idle = lock(&self.idle);
        match idle.get_mut(authority) {
            Some(conns) => conns.push(conn),
            None => {
                idle.insert(authority.to_owned(), vec![conn]);
            }
        }
    }

    /// Connections waiting, to every authority.
    pub fn idle_count(&self) -> usize {
        lock(&self.idle).values().map(Vec::len).sum()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain values: consistent even if a holder panicked.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Open a new connection to `authority` (name resolution and TCP connect, `TCP_NODELAY`).
pub async fn connect(authority: &str) -> io::Result<Conn> {
    let stream = TcpStream::connect(dial_address(authority)).await?;
    stream.set_nodelay(true)?;
    Ok(Conn {
        stream,
        buf: Vec::new(),
        pos: 0,
        reused: false,
        heard: false,
    })
}

/// One keep-alive connection and the bytes read from it but not yet used.
pub struct Conn {
    stream: TcpStream,
    /// `buf[pos..]` is read and not yet used.
    buf: Vec<u8>,
    pos: usize,
    /// It carried an earlier request to the end of its response (a connection opened for
    /// this request, or before the run, never did).
    reused: bool,
    /// Bytes of a response came back since the latest request was written.
    heard: bool,
}

impl Conn {
    /// It carried an earlier request to the end of its response, and nothing of the latest
    /// request's response came back: a close or reset now is the server closing a
    /// keep-alive connection it took for idle, and it never saw the request (the client's
    /// resend rule). A connection opened for the request, or pre-opened for the run, never
    /// qualifies: the server may have read the request on it.
    pub fn reused_without_response(&self) -> bool {
        self.reused && !self.heard
    }

    /// A waiting connection is still usable when a read would wait: the server closed it
    /// when the read sees the end, and bytes nobody asked for mean it is not in step either.
    fn still_open(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.stream.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Read once more into the buffer; returns the bytes read (0 at the end of the stream).
    async fn fill(&mut self) -> io::Result<usize> {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(INITIAL_BUFFER);
        } else if self.buf.len() == self.buf.capacity() {
            if self.pos > 0 {
                // Keep the unused tail, at the front.
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            if self.buf.len() == self.buf.capacity() {
                // A burst, a large head or a long line: double, within the caps the callers
                // check (head, line) or for throughput (data).
                let grow = self.buf.capacity().clamp(INITIAL_BUFFER, MAX_READ_BUFFER);
                self.buf.reserve_exact(grow);
            }
        }
        let read = self.stream.read_buf(&mut self.buf).await?;
        if read > 0 && self.buf.len() == self.buf.capacity() {
            // This read filled the buffer: more is likely waiting (a burst). Grow now, since
            // the body decoder uses every byte before the next read and the check above (a
            // full buffer at the next read) would never see it: the buffer would stay at
            // 2 KiB and a 72 KB burst would take 38 reads instead of 6.
            let room = MAX_READ_BUFFER.saturating_sub(self.buf.capacity());
            self.buf.reserve_exact(self.buf.capacity().min(room));
        }
        Ok(read)
    }

    /// Write a request: `head` then `body`, as few writes as the socket allows.
    pub async fn write_request(&mut self, head: &[u8], body: &[u8]) -> io::Result<()> {
        self.heard = false;
        let (mut head, mut body) = (head, body);
        while !head.is_empty() || !body.is_empty() {
            let written = if head.is_empty() {
                self.stream.write(body).await?
            } else {
                self.stream
                    .write_vectored(&[IoSlice::new(head), IoSlice::new(body)])
                    .await?
            };
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            let from_head = written.min(head.len());
            head = &head[from_head..];
            body = &body[written - from_head..];
        }
        Ok(())
    }

    /// Read the response head (skipping interim 1xx heads). A failure before any byte of
    /// the response is [`H1Error::closed_before_response`] or the socket's own error.
    pub async fn read_head(&mut self, method: &Method) -> Result<Head, H1Error> {
        let mut any_byte = !self.buffered().is_empty();
        loop {
            if !self.buffered().is_empty() {
                if let Some((head, used)) = parse_head(self.buffered(), method)? {
                    self.pos += used;
                    if head.status.is_informational()
                        && head.status != StatusCode::SWITCHING_PROTOCOLS
                    {
                        continue;
                    }
                    return Ok(head);
                }
                if self.buffered().len() > MAX_HEAD_BYTES {
                    return Err(H1Error::protocol("response head over 64 KiB"));
                }
            }
            let read = self.fill().await?;
            if read == 0 {
                return Err(if any_byte {
                    H1Error::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed in the response head",
                    ))
                } else {
                    H1Error::closed_before_response()
                });
            }
            any_byte = true;
            self.heard = true;
        }
    }
}

/// A response head: what the replay needs of it.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub content_type: Option<String>,
    body: BodyState,
    /// The server (or HTTP/1.0) said the connection ends with this response.
    close: bool,
}

/// Parse a complete head at the start of `bytes`: the head and its length, or `None` when
/// more bytes are needed.
fn parse_head(bytes: &[u8], method: &Method) -> Result<Option<(Head, usize)>, H1Error> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let used = match response.parse(bytes) {
        Ok(httparse::Status::Complete(used)) => used,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) if bytes.len() < HTTP2_FRAME_HEADER && bytes.first() == Some(&0) => {
            // Perhaps an HTTP/2 frame's header (its length starts with 0): read on to know.
            return Ok(None);
        }
        Err(_) if is_http2_frame(bytes) => return Err(H1Error::Http2Answer),
        Err(error) => return Err(H1Error::protocol(format!("response head: {error}"))),
    };
    let code = response.code.unwrap_or(0);
    let status =
        StatusCode::from_u16(code).map_err(|_| H1Error::protocol(format!("status code {code}")))?;
    let mut close = response.version != Some(1);
    let mut content_type = None;
    let mut length: Option<u64> = None;
    let mut chunked = false;
    for header in response.headers.iter() {
        let name = header.name;
        if name.eq_ignore_ascii_case("content-type") {
            content_type = std::str::from_utf8(header.value).ok().map(str::to_owned);
        } else if name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(header.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| H1Error::protocol("content-length is not a number"))?;
            if length.is_some_and(|l| l != value) {
                return Err(H1Error::protocol("two different content-length headers"));
            }
            length = Some(value);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked is the last coding when it is there at all (RFC 9112 §6.1).
            chunked = header
                .value
                .split(|&b| b == b',')
                .next_back()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            if !chunked {
                // Another coding last: the body runs to the end of the connection.
                close = true;
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for token in header.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && response.version == Some(0) {
                    close = false;
                }
            }
        }
    }
    if status == StatusCode::SWITCHING_PROTOCOLS {
        // The connection now speaks something else: never back to the pool.
        close = true;
    }
    let bodiless = *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let body = if bodiless {
        BodyState::Done
    } else if chunked {
        BodyState::Chunked(Chunk::Size)
    } else if let Some(length) = length {
        if length == 0 {
            BodyState::Done
        } else {
            BodyState::Length(length)
        }
    } else {
        close = true;
        BodyState::UntilClose
    };
    Ok(Some((
        Head {
            status,
            content_type,
            body,
            close,
        },
        used,
    )))
}

/// The length of an HTTP/2 frame header (RFC 9113 §4.1).
const HTTP2_FRAME_HEADER: usize = 9;

/// `bytes` start with the header of an HTTP/2 connection-level frame a server sends first
/// or on a bad preface: a SETTINGS (type 4) or GOAWAY (type 7) frame on stream 0, of a
/// length no larger than the default maximum frame size (RFC 9113 §3.4, §6.5, §6.8).
fn is_http2_frame(bytes: &[u8]) -> bool {
    let Some(header) = bytes.get(..HTTP2_FRAME_HEADER) else {
        return false;
    };
    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]);
    let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    matches!(header[3], 4 | 7) && stream == 0 && length <= 16_384
}

/// Where the body decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyState {
    /// Bytes left of a `content-length` body.
    Length(u64),
    Chunked(Chunk),
    /// No length: the body ends with the connection.
    UntilClose,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// Bytes left of the current chunk's data.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines up to an empty one.
    Trailers,
}

/// A response being read: its head, and its connection until the body ends.
pub struct Response {
    pub status: StatusCode,
    pub content_type: Option<String>,
    conn: Option<Conn>,
    state: BodyState,
    close: bool,
    authority: String,
    pool: Arc<Pool>,
}

impl Response {
    pub fn new(head: Head, conn: Conn, authority: &str, pool: Arc<Pool>) -> Response {
        let mut response = Response {
            status: head.status,
            content_type: head.content_type,
            conn: Some(conn),
            state: head.body,
            close: head.close,
            authority: authority.to_owned(),
            pool,
        };
        response.release_if_done();
        response
    }

    /// The payload of the next read: every byte of body the read completed (across chunk
    /// boundaries), `None` at the end of the body.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, H1Error> {
        let mut out = Vec::new();
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Ok(None);
            };
            // The payload is at most what is buffered: one allocation, not a doubling chain.
            out.reserve_exact(conn.buffered().len());
            decode(&conn.buf, &mut conn.pos, &mut self.state, &mut out)?;
            if !out.is_empty() {
                self.release_if_done();
                return Ok(Some(Bytes::from(out)));
            }
            if self.state == BodyState::Done {
                self.release_if_done();
                return Ok(None);
            }
            if conn.fill().await? == 0 {
                if self.state == BodyState::UntilClose {
                    self.state = BodyState::Done;
                    self.conn = None;
                    return Ok(None);
                }
                self.conn = None;
                return Err(H1Error::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed before the body ended",
                )));
            }
        }
    }

    /// The caller has what it needs (a stream's terminal frame) but the body has not ended
    /// yet (its last chunk is on the way): read the rest, up to `limit` bytes, so the
    /// connection can carry another request. For up to `inline` here — the end usually
    /// follows the terminal frame within microseconds, and a closed loop's next request
    /// then finds this connection waiting instead of opening a new one (whose accept the
    /// server would make it wait for) — then in the background, up to `patience` in all.
    pub async fn finish(
        mut self,
        inline: std::time::Duration,
        patience: std::time::Duration,
        limit: usize,
    ) {
        if self.conn.is_none() || self.close || self.state == BodyState::UntilClose {
            return;
        }
        let mut read = 0usize;
        let started = tokio::time::Instant::now();
        let drain = async {
            while let Ok(Some(bytes)) = self.chunk().await {
                read += bytes.len();
                if read > limit {
                    return false;
                }
            }
            true
        };
        if tokio::time::timeout(inline, drain).await.is_ok() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let drain = async {
                while let Ok(Some(bytes)) = self.chunk().await {
                    read += bytes.len();
                    if read > limit {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout_at(started + patience, drain).await;
        });
    }

    /// Give the connection back to the pool once the body has ended cleanly.
    fn release_if_done(&mut self) {
        if self.state != BodyState::Done {
            return;
        }
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        // Bytes past the end of the response: the connection is out of step; drop it.
        if self.close || !conn.buffered().is_empty() {
            return;
        }
        conn.reused = true;
        // The buffer stays (a burst grew it for the next response too).
        conn.buf.clear();
        conn.pos = 0;
        self.pool.put(&self.authority, conn);
    }
}

/// Decode what `buf[*pos..]` holds of the body into `out`, moving `pos` and `state` on.
fn decode(
    buf: &[u8],
    pos: &mut usize,
    state: &mut BodyState,
    out: &mut Vec<u8>,
) -> Result<(), H1Error> {
    loop {
        let available = &buf[*pos..];
        if available.is_empty() {
            return Ok(());
        }
        match state {
            BodyState::Done => return Ok(()),
            BodyState::UntilClose => {
                out.extend_from_slice(available);
                *pos = buf.len();
                return Ok(());
            }
            BodyState::Length(left) => {
                let take = available
                    .len()
                    .min(usize::try_from(*left).unwrap_or(usize::MAX));
                out.extend_from_slice(&available[..take]);
                *pos += take;
                *left -= take as u64;
                if *left == 0 {
                    *state = BodyState::Done;
                }
                return Ok(());
            }
            BodyState::Chunked(Chunk::Data(left)) => {
                let take = available
                    .len()
                    .min(usize::try_from(*left).unwrap_or(usize::MAX));
                out.extend_from_slice(&available[..take]);
                *pos += take;
                *left -= take as u64;
                if *left == 0 {
                    *state = BodyState::Chunked(Chunk::DataEnd);
                }
            }
            BodyState::Chunked(Chunk::DataEnd) => match available {
                [b'\r', b'\n', ..] => {
                    *pos += 2;
                    *state = BodyState::Chunked(Chunk::Size);
                }
                [b'\n', ..] => {
                    *pos += 1;
                    *state = BodyState::Chunked(Chunk::Size);
                }
                [b'\r'] => return Ok(()),
                _ => return Err(H1Error::protocol("chunk data not followed by CRLF")),
            },
            BodyState::Chunked(Chunk::Size) => {
                let Some(end) = memchr::memchr(b'\n', available) else {
                    return check_line_length(available);
                };
                let size = parse_chunk_size(&available[..end])?;
                *pos += end + 1;
                *state = BodyState::Chunked(if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                });
            }
            BodyState::Chunked(Chunk::Trailers) => {
                let Some(end) = memchr::memchr(b'\n', available) else {
                    return check_line_length(available);
                };
                let last = end == 0 || (end == 1 && available[0] == b'\r');
                *pos += end + 1;
                if last {
                    *state = BodyState::Done;
                    return Ok(());
                }
            }
        }
    }
}

fn check_line_length(pending: &[u8]) -> Result<(), H1Error> {
    if pending.len() > MAX_LINE_BYTES {
        return Err(H1Error::protocol("chunk-size or trailer line over 8 KiB"));
    }
    Ok(())
}

/// `1a;ext=1\r` → 26.
fn parse_chunk_size(line: &[u8]) -> Result<u64, H1Error> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if digits.is_empty() || digits.len() > 15 {
        return Err(H1Error::protocol("chunk size"));
    }
    let mut size = 0u64;
    for &b in digits {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return Err(H1Error::protocol("chunk size is not hexadecimal")),
        };
        size = size * 16 + u64::from(digit);
    }
    Ok(size)
}

/// The request head: request line, `host`, the prepared headers, `accept` when absent (as
/// reqwest sends), `content-length` for a body (or any POST, PUT, PATCH).
pub fn request_head(
    method: &Method,
    authority: &str,
    target: &str,
    headers: &HeaderMap,
    body_len: usize,
) -> Vec<u8> {
    let mut head = Vec::with_capacity(128 + target.len() + 64 * headers.len());
    head.extend_from_slice(method.as_str().as_bytes());
    head.push(b' ');
    if !target.starts_with('/') {
        head.push(b'/');
    }
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    // A `--header 'Host: …'` of the user's wins over the URL's (a gateway's virtual host).
    match headers.get(http::header::HOST) {
        Some(host) => head.extend_from_slice(host.as_bytes()),
        None => head.extend_from_slice(authority.as_bytes()),
    }
    head.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name == http::header::HOST || name == http::header::CONTENT_LENGTH {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if !headers.contains_key(http::header::ACCEPT) {
        head.extend_from_slice(b"accept: */*\r\n");
    }
    if body_len > 0 || matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
        head.extend_from_slice(b"content-length: ");
        head.extend_from_slice(body_len.to_string().as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decoder fed `wire` one byte at a time (every split point is a read boundary).
    fn decode_all(wire: &[u8], state: BodyState) -> Result<(Vec<u8>, BodyState), H1Error> {
        let mut buf = Vec::new();
        let mut pos = 0;
        let mut out = Vec::new();
        let mut state = state;
        for byte in wire {
            buf.push(*byte);
            decode(&buf, &mut pos, &mut state, &mut out)?;
        }
        Ok((out, state))
    }

    #[test]
    fn an_http2_servers_first_frame_is_recognised() {
        // hyper's h2 server: SETTINGS (length 6·n, type 4, stream 0), then a GOAWAY.
        let settings = [0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 200];
        assert!(matches!(
            parse_head(&settings, &Method::POST),
            Err(H1Error::Http2Answer)
        ));
        let goaway = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        assert!(matches!(
            parse_head(&goaway, &Method::POST),
            Err(H1Error::Http2Answer)
        ));
        // Its first bytes alone: wait for the rest.
        assert!(matches!(
            parse_head(&settings[..4], &Method::POST),
            Ok(None)
        ));
        // Garbage is a protocol error, not HTTP/2.
        assert!(matches!(
            parse_head(b"SSH-2.0-OpenSSH_9.6\r\n", &Method::POST),
            Err(H1Error::Protocol(_))
        ));
    }

    /// Any bytes, any split: the head parser and the body decoder return or refuse, never
    /// panic; a valid chunked body decodes to its payload whatever the reads' sizes.
    #[test]
    fn random_bytes_and_splits_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let valid = b"4\r\ndata\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n";
        for _ in 0..2_000 {
            let mut wire = valid.to_vec();
            for _ in 0..rng.random_range(0..4) {
                let at = rng.random_range(0..wire.len());
                wire[at] = rng.random();
            }
            let _ = parse_head(&wire, &Method::POST);
            for state in [
                BodyState::Chunked(Chunk::Size),
                BodyState::Length(7),
                BodyState::UntilClose,
            ] {
                let _ = decode_all(&wire, state);
            }
            // The valid body, cut into reads of random sizes.
            let (mut buf, mut pos, mut out) = (Vec::new(), 0, Vec::new());
            let mut state = BodyState::Chunked(Chunk::Size);
            let mut rest = &valid[..];
            while !rest.is_empty() {
                let take = rng.random_range(1..=rest.len());
                buf.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                decode(&buf, &mut pos, &mut state, &mut out).expect("valid body");
            }
            assert_eq!(out, b"data0123456789abcdef");
            assert_eq!(state, BodyState::Done);
        }
    }

    #[test]
    fn chunked_bodies_decode_at_every_split() {
        let wire = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
        let (out, state) =
            decode_all(wire, BodyState::Chunked(Chunk::Size)).expect("valid chunked body");
        assert_eq!(out, b"hello world");
        assert_eq!(state, BodyState::Done);
    }

    #[test]
    fn bad_chunk_sizes_are_refused() {
        for wire in [&b"zz\r\n"[..], b"5\r\nhelloXX", b"fffffffffffffffff\r\n"] {
            assert!(
                decode_all(wire, BodyState::Chunked(Chunk::Size)).is_err(),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    #[test]
    fn heads_give_status_type_and_framing() {
        let (head, used) = parse_head(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\nrest",
            &Method::POST,
        )
        .expect("valid")
        .expect("complete");
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.content_type.as_deref(), Some("text/event-stream"));
        assert_eq!(head.body, BodyState::Chunked(Chunk::Size));
        assert!(!head.close);
        assert_eq!(used, 80);
        let (head, _) = parse_head(
            b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n",
            &Method::POST,
        )
        .expect("valid")
        .expect("complete");
        assert_eq!(head.body, BodyState::Length(3));
        assert!(head.close, "HTTP/1.0 closes unless it says keep-alive");
        let (head, _) = parse_head(b"HTTP/1.1 200 OK\r\n\r\n", &Method::POST)
            .expect("valid")
            .expect("complete");
        assert_eq!(head.body, BodyState::UntilClose);
        assert!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-", &Method::POST)
                .expect("valid so far")
                .is_none()
        );
        assert!(
            parse_head(
                b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                &Method::POST
            )
            .is_err()
        );
    }

    /// A burst (reads that fill the buffer) doubles the buffer up to its cap even though the
    /// decoder uses every byte between reads; a stream of small reads keeps it at 2 KiB.
    #[tokio::test]
    async fn reads_that_fill_the_buffer_grow_it_up_to_the_cap() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            socket.write_all(b"small").await.expect("write");
            // Wait for the client to read it, then send a burst of 512 KiB at once.
            let mut byte = [0u8; 1];
            tokio::io::AsyncReadExt::read_exact(&mut socket, &mut byte)
                .await
                .expect("go");
            socket
                .write_all(&vec![b'x'; 512 << 10])
                .await
                .expect("burst");
        });
        let mut conn = connect(&address.to_string()).await.expect("connect");
        assert_eq!(conn.fill().await.expect("read"), 5);
        conn.pos = conn.buf.len();
        assert_eq!(
            conn.buf.capacity(),
            INITIAL_BUFFER,
            "a small read does not grow it"
        );
        conn.stream.write_all(b"g").await.expect("go");
        let mut total = 0;
        let mut largest = 0;
        while total < 512 << 10 {
            let read = conn.fill().await.expect("read");
            assert!(read > 0, "the burst ended early");
            total += read;
            largest = largest.max(read);
            // As the body decoder does: every byte used before the next read.
            conn.pos = conn.buf.len();
        }
        assert_eq!(conn.buf.capacity(), MAX_READ_BUFFER);
        assert!(largest > INITIAL_BUFFER, "largest read {largest} bytes");
        server.await.expect("server");
    }

    #[test]
    fn urls_split_into_authority_and_target() {
        assert_eq!(
            split_url("http://h:8000/v1/chat?x=1"),
            Some(("h:8000", "/v1/chat?x=1"))
        );
        assert_eq!(split_url("http://h?x=1"), Some(("h", "?x=1")));
        assert_eq!(split_url("https://h/v1"), None);
        assert_eq!(split_url("http://user:pw@h/v1"), None);
        assert_eq!(dial_address("h"), "h:80");
        assert_eq!(dial_address("[::1]"), "[::1]:80");
        assert_eq!(dial_address("[::1]:9"), "[::1]:9");
    }

    #[test]
    fn request_heads_carry_host_length_and_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "application/json".parse().expect("value"));
        let head = request_head(&Method::POST, "h:1", "?q=1", &headers, 12);
        assert_eq!(
            String::from_utf8(head).expect("ascii"),
            "POST /?q=1 HTTP/1.1\r\nhost: h:1\r\ncontent-type: application/json\r\naccept: */*\r\ncontent-length: 12\r\n\r\n"
        );
        headers.insert("host", "api.example.com".parse().expect("value"));
        let head = request_head(&Method::GET, "10.0.0.1:80", "/v1/models", &headers, 0);
        assert_eq!(
            String::from_utf8(head).expect("ascii"),
            "GET /v1/models HTTP/1.1\r\nhost: api.example.com\r\ncontent-type: application/json\r\naccept: */*\r\n\r\n"
        );
    }
}
