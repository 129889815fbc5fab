//! hyper's `client::conn::http1` as the cleartext HTTP/1.1 transport, the alternative to
//! [`h1`](crate::h1) measured in `docs/performance.md` ("One send path"): a pool of
//! keep-alive connections, each with a read buffer of a set size
//! (`read_buf_exact_size`), whose connection future is driven inside the request's task
//! (no connection task: the task that reads a response polls the connection and the body
//! together). Chosen only by the internal switch [`SEND_PATH_ENV`], for the benchmark's
//! same-run comparison; it follows the same send rules as every transport (`client`).

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Incoming};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The internal switch (not a user option): `hyper-conn` or `hyper-conn:BYTES` sends
/// cleartext HTTP/1.1 through this transport with a read buffer of BYTES (default 2 KiB,
/// `h1`'s initial buffer); anything else, or unset, through `h1`.
pub const SEND_PATH_ENV: &str = "LLM_REPLAY_BENCH_SEND_PATH";

/// The read buffer's size when the switch names none.
const DEFAULT_READ_BUFFER: usize = 2 << 10;

/// The read buffer the switch asks for, when it asks for this transport.
pub fn from_environment() -> Option<usize> {
    let value = std::env::var(SEND_PATH_ENV).ok()?;
    let rest = value.strip_prefix("hyper-conn")?;
    match rest.strip_prefix(':') {
        Some(size) => size.parse().ok().filter(|size| *size >= 64),
        None if rest.is_empty() => Some(DEFAULT_READ_BUFFER),
        None => None,
    }
}

/// One connection: the handle requests are sent on and the connection future, which the
/// task holding it polls.
pub struct Conn {
    sender: http1::SendRequest<Full<Bytes>>,
    driver: http1::Connection<TokioIo<TcpStream>, Full<Bytes>>,
    /// The connection future finished (closed or failed): it is never polled again.
    ended: bool,
    /// It carried an earlier request to the end of its response (a connection opened for
    /// this request, or before the run, never did).
    reused: bool,
}

impl Conn {
    /// It carried an earlier request to the end of its response: the client's resend rule
    /// (hyper does not say whether bytes of the failed response came back).
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Poll the connection future, unless it ended; true once it has.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.ended && Pin::new(&mut self.driver).poll(cx).is_ready() {
            self.ended = true;
        }
        self.ended
    }

    /// A waiting connection is usable when its future has nothing to say: a close read
    /// while idle ends it.
    fn still_open(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        !self.drive(&mut cx) && !self.sender.is_closed()
    }

    /// Send `request` and wait for its response head, driving the connection meanwhile.
    pub async fn send(
        &mut self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<Incoming>, ConnError> {
        poll_fn(|cx| {
            let ended = self.drive(cx);
            match self.sender.poll_ready(cx) {
                Poll::Pending if ended => Poll::Ready(Err(ConnError::closed())),
                Poll::Pending => Poll::Pending,
                Poll::Ready(ready) => Poll::Ready(ready.map_err(ConnError::Hyper)),
            }
        })
        .await?;
        let mut response = std::pin::pin!(self.sender.send_request(request));
        poll_fn(|cx| {
            self.drive(cx);
            response.as_mut().poll(cx)
        })
        .await
        .map_err(ConnError::Hyper)
    }
}

/// Why a connection could not be opened or carry a request. Not transparent: the source is
/// the I/O or hyper error itself, which the classification reads.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("{0}")]
    Io(#[source] std::io::Error),
    #[error("{0}")]
    Hyper(#[source] hyper::Error),
}

impl ConnError {
    /// The connection ended before it could take the request.
    fn closed() -> ConnError {
        ConnError::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed before the request was sent",
        ))
    }
}

/// Open a connection to `authority` with a read buffer of `read_buffer` bytes.
pub async fn connect(authority: &str, read_buffer: usize) -> Result<Conn, ConnError> {
    let stream = TcpStream::connect(crate::h1::dial_address(authority))
        .await
        .map_err(ConnError::Io)?;
    stream.set_nodelay(true).map_err(ConnError::Io)?;
    let (sender, driver) = http1::Builder::new()
        .read_buf_exact_size(Some(read_buffer))
        .handshake(TokioIo::new(stream))
        .await
        .map_err(ConnError::Hyper)?;
    Ok(Conn {
        sender,
        driver,
        ended: false,
        reused: false,
    })
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
        lock(&self.idle)
            .entry(authority.to_owned())
            .or_default()
            .push(conn);
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

/// A response being read: its body, and its connection, driven by whoever reads the body.
pub struct Response {
    pub status: http::StatusCode,
    pub content_type: Option<String>,
    body: Incoming,
    conn: Option<Conn>,
    authority: String,
    pool: Arc<Pool>,
}

impl Response {
    pub fn new(
        response: http::Response<Incoming>,
        conn: Conn,
        authority: &str,
        pool: Arc<Pool>,
    ) -> Response {
        let (parts, body) = response.into_parts();
        let mut response = Response {
            status: parts.status,
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            body,
            conn: Some(conn),
            authority: authority.to_owned(),
            pool,
        };
        if response.body.is_end_stream() {
            response.release();
        }
        response
    }

    /// The next data frame of the body, `None` at its end; the connection is driven while
    /// waiting.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, hyper::Error> {
        let next = poll_fn(|cx| {
            loop {
                if let Some(conn) = self.conn.as_mut() {
                    conn.drive(cx);
                }
                match Pin::new(&mut self.body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                        Ok(data) if !data.is_empty() => return Poll::Ready(Ok(Some(data))),
                        // Trailers, or an empty frame: on to the next.
                        _ => continue,
                    },
                    Poll::Ready(Some(Err(error))) => return Poll::Ready(Err(error)),
                    Poll::Ready(None) => return Poll::Ready(Ok(None)),
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await;
        match &next {
            Ok(None) => self.release(),
            Err(_) => self.conn = None,
            Ok(Some(_)) => {}
        }
        next
    }

    /// The caller has what it needs, the body has not ended: read the rest, up to `limit`
    /// bytes, for up to `inline` here and then in the background, up to `patience` in all,
    /// so the connection can carry another request (as `h1::Response::finish`).
    pub async fn finish(
        mut self,
        inline: std::time::Duration,
        patience: std::time::Duration,
        limit: usize,
    ) {
        if self.conn.is_none() {
            return;
        }
        let started = tokio::time::Instant::now();
        let mut read = 0usize;
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

    /// The body ended: the connection goes back to the pool unless it ended too.
    fn release(&mut self) {
        if let Some(mut conn) = self.conn.take()
            && !conn.ended
            && !conn.sender.is_closed()
        {
            conn.reused = true;
            self.pool.put(&self.authority, conn);
        }
    }
}

/// The request as hyper sends it: `host` (the user's `Host` header wins), the prepared
/// headers, `accept: */*` when absent; hyper adds `content-length` from the body.
pub fn request(
    method: &http::Method,
    authority: &str,
    target: &str,
    headers: &http::HeaderMap,
    body: &Bytes,
) -> Result<http::Request<Full<Bytes>>, http::Error> {
    let target = if target.starts_with('/') {
        target.to_owned()
    } else {
        format!("/{target}")
    };
    let mut request = http::Request::builder()
        .method(method.clone())
        .uri(target)
        .body(Full::new(body.clone()))?;
    let sent = request.headers_mut();
    if !headers.contains_key(http::header::HOST) {
        sent.insert(http::header::HOST, http::HeaderValue::from_str(authority)?);
    }
    for (name, value) in headers {
        if name != http::header::CONTENT_LENGTH {
            sent.append(name.clone(), value.clone());
        }
    }
    if !headers.contains_key(http::header::ACCEPT) {
        sent.insert(http::header::ACCEPT, http::HeaderValue::from_static("*/*"));
    }
    Ok(request)
}
