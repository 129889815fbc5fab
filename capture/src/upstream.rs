//! The client to the upstream: pooled connections (HTTP/1.1, or HTTP/2 by ALPN or with
//! `--upstream-h2c`), one resend of a request whose reused connection closed before any
//! response byte, and the cause of every failure, named for the client's 502 and for the
//! recording.
//!
//! Servers such as llama.cpp's close a kept-alive HTTP/1.1 connection after each streamed
//! response without saying `Connection: close`. When the close comes after the pool handed
//! the connection to the next request, that request is written to a connection the server is
//! closing, and fails before any byte of response (through the proxy, 5–9 of 102 requests
//! at concurrency 8 got a 502). hyper-util's pool sends a request again only when it was
//! never written (`retry_canceled_requests`); one written and then cut is an error. The
//! server never answered it, so it is sent once more, on a new connection (a client without
//! a pool), under the rule of the replay's own client (`worker::client`): only when the
//! connection had carried an earlier request, closed or reset before a single byte of this
//! request's response, at most once per request; never after a failure on a new connection,
//! never after a response byte.
//!
//! hyper-util does not say whether the failed connection was reused, nor whether part of a
//! response head came back (a head cut short is the same "incomplete message"). The
//! connection says it: every connection is wrapped in a [`Metered`] stream that counts,
//! above TLS, the requests begun on it and the bytes read since the latest began, and hands
//! its meter to hyper-util's connection info (`Connected::extra`), which a failed request's
//! error carries.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Uri;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A problem setting up TLS to the upstream: the one TLS module's ([`common::tls`]), the
/// `--upstream-ca` file named.
pub type TlsSetupError = common::tls::TlsError;

/// The HTTP client to the upstream: a pooled client for every first attempt and a client
/// without a pool for resends, both over [`Metered`] connections.
pub struct UpstreamClient {
    pooled: Client<MeteredConnector, Full<Bytes>>,
    fresh: Client<MeteredConnector, Full<Bytes>>,
    /// `--upstream-h2c`: every connection is HTTP/2 (whose streams the rule does not cover).
    http2_only: bool,
    /// Requests sent a second time (see the module's rule).
    resent: AtomicU64,
}

/// Build the upstream client. TLS is the one TLS module's (`common::tls`): the Mozilla roots
/// (webpki-roots) plus the PEM certificates in `extra_ca` (`--upstream-ca`, for private CAs
/// and tests; a file with none is an error naming it), each also trusted as a pinned
/// self-signed server certificate, name and dates checked.
pub fn upstream_client(
    h2c: bool,
    extra_ca: Option<&std::path::Path>,
) -> Result<UpstreamClient, TlsSetupError> {
    let ca = match extra_ca {
        Some(path) => vec![common::tls::CaPem::read("--upstream-ca", path)?],
        None => Vec::new(),
    };
    let trust = common::tls::Trust {
        ca,
        insecure: false,
    };
    // ALPN is hyper-rustls's (`enable_all_versions`: h2, then http/1.1).
    let tls = common::tls::client_config(&trust, common::tls::Alpn::ByConnector)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    let connector = MeteredConnector(https);
    let mut pooled = Client::builder(hyper_util::rt::TokioExecutor::new());
    pooled.http2_only(h2c);
    let mut fresh = pooled.clone();
    // No idle connection is kept: every request of this client opens its own.
    fresh.pool_max_idle_per_host(0);
    Ok(UpstreamClient {
        pooled: pooled.build(connector.clone()),
        fresh: fresh.build(connector),
        http2_only: h2c,
        resent: AtomicU64::new(0),
    })
}

/// A request forwarded: the response (or why there is none), and when the attempt that
/// got it was sent.
pub struct Sent {
    pub result: Result<http::Response<Incoming>, SendError>,
    /// Just before the attempt that got the result was sent (the resend's, after one).
    pub t0: Instant,
    /// The request was sent a second time, on a new connection.
    pub resent: bool,
}

/// Why a forwarded request got no response.
#[derive(Debug)]
pub enum SendError {
    /// No response headers by the deadline (`--upstream-idle-timeout`).
    Timeout,
    /// The transport failed: the cause, and the error it was read from.
    Failed {
        cause: FailureCause,
        error: hyper_util::client::legacy::Error,
    },
}

/// What went wrong on the way to the upstream, as a client can act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureCause {
    /// Nothing listened on the upstream's port.
    Refused,
    /// Connecting timed out.
    ConnectTimedOut,
    /// The upstream's host name did not resolve.
    Dns,
    /// The TLS handshake failed.
    Tls,
    /// The upstream reset the connection before a whole response head.
    Reset,
    /// The upstream closed the connection before a whole response head.
    ClosedBeforeResponse,
    /// Anything else (a response the parser rejected, an unclassified I/O error).
    Other,
}

impl FailureCause {
    /// What happened, after "the upstream URL" (`could not be reached: connection refused`).
    pub fn phrase(self) -> &'static str {
        match self {
            FailureCause::Refused => "could not be reached: connection refused",
            FailureCause::ConnectTimedOut => "could not be reached: connecting timed out",
            FailureCause::Dns => "could not be reached: its host name did not resolve",
            FailureCause::Tls => "could not be reached: the TLS handshake failed",
            FailureCause::Reset => "reset the connection before a response",
            FailureCause::ClosedBeforeResponse => "closed the connection before a response",
            FailureCause::Other => "failed before a response",
        }
    }
}

impl UpstreamClient {
    /// Send `request` on a pooled connection and, when that connection had carried an
    /// earlier request and closed or reset before a byte of this one's response came back,
    /// once more on a new connection. `deadline` bounds the wait for response headers over
    /// both attempts.
    pub async fn send(
        &self,
        request: http::Request<Full<Bytes>>,
        deadline: tokio::time::Instant,
    ) -> Sent {
        let spare = copy_request(&request);
        let t0 = Instant::now();
        let error = match tokio::time::timeout_at(deadline, self.pooled.request(request)).await {
            Ok(Ok(response)) => {
                return Sent {
                    result: Ok(response),
                    t0,
                    resent: false,
                };
            }
            Err(_elapsed) => {
                return Sent {
                    result: Err(SendError::Timeout),
                    t0,
                    resent: false,
                };
            }
            Ok(Err(error)) => error,
        };
        let cause = classify(&error);
        if !self.resendable(&error, cause) {
            return Sent {
                result: Err(SendError::Failed { cause, error }),
                t0,
                resent: false,
            };
        }
        tracing::debug!(
            cause = cause.phrase(),
            error = %chain(&error),
            "the reused upstream connection closed before a response; resending once on a new connection"
        );
        self.resent.fetch_add(1, Ordering::Relaxed);
        let t0 = Instant::now();
        let result = match tokio::time::timeout_at(deadline, self.fresh.request(spare)).await {
            Ok(Ok(response)) => Ok(response),
            Err(_elapsed) => Err(SendError::Timeout),
            Ok(Err(error)) => Err(SendError::Failed {
                cause: classify(&error),
                error,
            }),
        };
        Sent {
            result,
            t0,
            resent: true,
        }
    }

    /// Send `request` once, on a pooled connection.
    pub async fn request(
        &self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<Incoming>, hyper_util::client::legacy::Error> {
        self.pooled.request(request).await
    }

    /// Requests sent a second time so far.
    pub fn resent(&self) -> u64 {
        self.resent.load(Ordering::Relaxed)
    }

    /// The rule: an HTTP/1.1 connection that had carried an earlier request closed or reset
    /// before a byte of this request's response came back.
    fn resendable(&self, error: &hyper_util::client::legacy::Error, cause: FailureCause) -> bool {
        if self.http2_only
            || error.is_connect()
            || !matches!(
                cause,
                FailureCause::Reset | FailureCause::ClosedBeforeResponse
            )
        {
            return false;
        }
        let Some(connected) = error.connect_info() else {
            return false;
        };
        if connected.is_negotiated_h2() {
            return false;
        }
        let mut extensions = http::Extensions::new();
        connected.get_extras(&mut extensions);
        extensions
            .get::<MeterHandle>()
            .is_some_and(|meter| meter.0.reused_without_response())
    }
}

/// The same request again (the body is shared bytes, not copied).
fn copy_request(request: &http::Request<Full<Bytes>>) -> http::Request<Full<Bytes>> {
    let mut copy = http::Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    copy
}

/// The cause of a failure, in the proxy's words: the classification the replay's client
/// uses too (`common::transport::classify`, from the error's source chain), with a socket
/// timeout named (`connecting timed out`) and the causes a proxy has no word for
/// (`http2_only`: `--upstream-h2c` is the proxy's own flag) as [`FailureCause::Other`].
pub fn classify(error: &(dyn StdError + 'static)) -> FailureCause {
    use common::measure::TransportCause;
    use common::transport::ChainCause;
    match common::transport::classify(error) {
        ChainCause::TimedOut => FailureCause::ConnectTimedOut,
        ChainCause::Transport(cause) => match cause {
            TransportCause::Refused => FailureCause::Refused,
            TransportCause::Reset => FailureCause::Reset,
            TransportCause::ClosedBeforeResponse => FailureCause::ClosedBeforeResponse,
            TransportCause::Tls(_) => FailureCause::Tls,
            TransportCause::Dns => FailureCause::Dns,
            TransportCause::ClosedAfterHead | TransportCause::Http2Only | TransportCause::Other => {
                FailureCause::Other
            }
        },
    }
}

/// An error and its causes, `: `-separated (hyper-util's own text is only its kind).
pub fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    while let Some(e) = current {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        current = e.source();
    }
    text
}

/// `1.5s`, `300s`: a duration as the flags write it.
pub fn humanize(duration: Duration) -> String {
    format!("{}s", duration.as_secs_f64())
}

/// What one connection has carried, counted above TLS by its [`Metered`] stream.
#[derive(Debug, Default)]
pub struct ConnectionMeter {
    /// Requests begun: a write after the previous request's response had begun arriving
    /// (HTTP/1.1 writes a request whole before it reads its response, and takes a connection
    /// from the pool only once the previous response has ended).
    requests: AtomicU64,
    /// Bytes read since the latest request began.
    read_since_request: AtomicU64,
}

impl ConnectionMeter {
    fn writing(&self) {
        // The connection's task alone reads and writes it: plain loads and stores suffice.
        if self.requests.load(Ordering::Relaxed) == 0
            || self.read_since_request.load(Ordering::Relaxed) > 0
        {
            self.requests.fetch_add(1, Ordering::Relaxed);
            self.read_since_request.store(0, Ordering::Relaxed);
        }
    }

    fn read(&self, bytes: usize) {
        self.read_since_request
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The connection carried an earlier request, and nothing of the latest one's response
    /// came back.
    pub fn reused_without_response(&self) -> bool {
        self.requests.load(Ordering::Relaxed) >= 2
            && self.read_since_request.load(Ordering::Relaxed) == 0
    }
}

/// The meter as hyper-util carries it in a connection's info.
#[derive(Debug, Clone)]
struct MeterHandle(Arc<ConnectionMeter>);

/// The upstream connector, whose connections are [`Metered`].
#[derive(Clone)]
pub struct MeteredConnector(HttpsConnector<HttpConnector>);

type PlainOrTls = MaybeHttpsStream<TokioIo<TcpStream>>;
type BoxError = Box<dyn StdError + Send + Sync>;

impl tower_service::Service<Uri> for MeteredConnector {
    type Response = Metered;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Metered, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let meter = Arc::new(ConnectionMeter::default());
            Ok(Metered {
                io: TokioIo::new(Counted {
                    inner: TokioIo::new(connecting.await?),
                    meter: meter.clone(),
                }),
                meter,
            })
        })
    }
}

/// An upstream connection (plain or TLS) whose plaintext reads and writes are counted in
/// its [`ConnectionMeter`]. The counting is done on tokio's I/O traits, whose read buffer
/// tells how many bytes a read filled (the stream goes hyper → tokio → hyper, without a
/// copy).
pub struct Metered {
    io: TokioIo<Counted<TokioIo<PlainOrTls>>>,
    meter: Arc<ConnectionMeter>,
}

/// The counting layer of a [`Metered`] connection.
struct Counted<T> {
    inner: T,
    meter: Arc<ConnectionMeter>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        if read > 0 {
            self.meter.read(read);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if !buf.is_empty() {
            self.meter.writing();
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if bufs.iter().any(|b| !b.is_empty()) {
            self.meter.writing();
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl hyper::rt::Read for Metered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Metered {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        hyper::rt::Write::is_write_vectored(&self.io)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Connection for Metered {
    fn connected(&self) -> Connected {
        self.io
            .inner()
            .inner
            .inner()
            .connected()
            .extra(MeterHandle(self.meter.clone()))
    }
}

#[cfg(test)]
mod meter_tests {
    use super::{ConnectionMeter, FailureCause, classify};

    #[test]
    fn a_connection_is_reused_without_response_only_between_a_second_write_and_its_first_read() {
        let meter = ConnectionMeter::default();
        assert!(!meter.reused_without_response(), "nothing sent yet");
        // The first request: head, then body, then its response.
        meter.writing();
        meter.writing();
        assert!(!meter.reused_without_response(), "a new connection");
        meter.read(120);
        meter.read(40);
        assert!(!meter.reused_without_response());
        // The second request on the same connection: nothing back yet.
        meter.writing();
        meter.writing();
        assert!(meter.reused_without_response());
        // One byte of its response: never sent again.
        meter.read(1);
        assert!(!meter.reused_without_response());
    }

    #[test]
    fn failures_are_named_by_their_io_kind() {
        use std::io::{Error, ErrorKind};
        for (kind, cause) in [
            (ErrorKind::ConnectionRefused, FailureCause::Refused),
            (ErrorKind::ConnectionReset, FailureCause::Reset),
            (ErrorKind::BrokenPipe, FailureCause::Reset),
            (ErrorKind::TimedOut, FailureCause::ConnectTimedOut),
            (ErrorKind::UnexpectedEof, FailureCause::ClosedBeforeResponse),
            (ErrorKind::InvalidData, FailureCause::Other),
        ] {
            assert_eq!(classify(&Error::from(kind)), cause, "{kind:?}");
        }
    }
}
