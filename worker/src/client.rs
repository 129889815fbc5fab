//! The HTTP client of the replay: TLS trust (Mozilla roots, `--target-ca`, `--insecure`),
//! HTTP/2 by ALPN or prior knowledge (`--target-h2c`), SigV4 signing, one resend on a fresh
//! connection when a reused HTTP/1.1 connection closed before any response byte, and the
//! cause of every transport failure.
//!
//! Servers such as llama.cpp close a keep-alive connection after each streamed response
//! without saying `Connection: close`; the next request written on that pooled connection
//! then fails before any response byte. Such a request never reached the model, so it is
//! sent once more on a connection of its own, and counted as resent. Only then: the
//! connection must have carried an earlier request to its response (the rule of the
//! recording proxy, `capture::upstream`, too). A request that fails on a connection opened
//! for it, or pre-opened for the run — one the server never answered on — is failed with
//! its cause: the server may have read it. So is a request over HTTP/2, whose server says
//! which streams it did not process (GOAWAY, `REFUSED_STREAM`; hyper and reqwest send those
//! again themselves).
//!
//! Two transports carry requests: reqwest (HTTPS, HTTP/2, SigV4, a proxy) and the own
//! HTTP/1.1 client `h1` (cleartext targets). The send rules are written once, over both ([`TargetClient::send_route`]): t0, the deadline, the resend, the
//! connection timing; so are the pre-opening of connections (`open_ahead`) and the
//! classification of failures ([`classify`], on `common::transport`'s, which the recording
//! proxy shares). A transport contributes one attempt and nothing else.

use std::any::Any;
use std::collections::HashSet;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::measure::{TlsProblem, TransportCause};
use common::metrics::{HttpProtocol, TlsVersion};
use hyper_util::client::legacy::connect::{Connected, HttpInfo};
use rustls::pki_types::ServerName;

use crate::config::TransportConfig;
use crate::h1;
use crate::metrics_actor::MetricsHandle;

/// Why the HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The TLS configuration (a `--target-ca` file, named by its position): see
    /// [`common::tls`].
    #[error(transparent)]
    Tls(#[from] common::tls::TlsError),
    #[error("could not build the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
}

/// The clients of one run: a pooled one for every request, and one that never reuses a
/// connection, for resends. Both time every connection they open ([`Metric::Connect`],
/// [`Metric::TlsHandshake`]); the pooled one also uses the connections
/// [`TargetClient::preconnect`] opened before the run.
///
/// [`Metric::Connect`]: common::metrics::Metric::Connect
/// [`Metric::TlsHandshake`]: common::metrics::Metric::TlsHandshake
#[derive(Clone)]
pub struct TargetClient {
    pooled: reqwest::Client,
    fresh: reqwest::Client,
    signer: Option<crate::sigv4::SigV4Signer>,
    connections: Arc<ConnectShared>,
    /// Cleartext HTTP/2 with prior knowledge: one connection carries every stream.
    h2c: bool,
    /// The cleartext HTTP/1.1 transport's keep-alive connections: `http://` targets go
    /// through it unless HTTP/2, SigV4 or a proxy is asked for ([`TargetClient::own_http1`]).
    h1: Option<Arc<h1::Pool>>,
}

/// A response head and the body to read, from either client.
pub enum Response {
    Reqwest(reqwest::Response),
    H1(h1::Response),
}

/// Why reading a response body failed.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// reqwest's error, without the URL (which may carry credentials).
    #[error("{0}")]
    Reqwest(#[source] reqwest::Error),
    #[error("{0}")]
    H1(#[source] h1::H1Error),
}

impl Response {
    pub fn status(&self) -> http::StatusCode {
        match self {
            Response::Reqwest(response) => response.status(),
            Response::H1(response) => response.status,
        }
    }

    /// The `content-type` header, when it is text.
    pub fn content_type(&self) -> Option<&str> {
        match self {
            Response::Reqwest(response) => response
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Response::H1(response) => response.content_type.as_deref(),
        }
    }

    /// The protocol that carried the response: HTTP/2 over TLS (`h2`) or cleartext (`h2c`),
    /// else HTTP/1.1.
    pub fn protocol(&self) -> HttpProtocol {
        match self {
            Response::Reqwest(response) if response.version() == http::Version::HTTP_2 => {
                if response.url().scheme() == "https" {
                    HttpProtocol::H2
                } else {
                    HttpProtocol::H2c
                }
            }
            Response::Reqwest(_) | Response::H1(_) => HttpProtocol::Http1,
        }
    }

    /// The next bytes of the body, `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<bytes::Bytes>, BodyError> {
        match self {
            Response::Reqwest(response) => response
                .chunk()
                .await
                .map_err(|e| BodyError::Reqwest(e.without_url())),
            Response::H1(response) => response.chunk().await.map_err(BodyError::H1),
        }
    }

    /// The caller is done with a body that has not ended yet (a stream's terminal frame
    /// came before the end of the body): let the connection finish it and carry another
    /// request, when the client can (the own HTTP/1.1 client reads the rest, for up to 2 ms
    /// here, then in the background, up to a second and 64 KiB in all); otherwise the
    /// connection is dropped.
    pub async fn finish(self) {
        let (inline, patience, limit) =
            (Duration::from_millis(2), Duration::from_secs(1), 64 << 10);
        match self {
            Response::H1(response) => response.finish(inline, patience, limit).await,
            Response::Reqwest(_) => {}
        }
    }
}

/// Why sending failed before a response head arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendFailure {
    /// The deadline passed first.
    Timeout,
    /// The transport failed, for this cause.
    Transport(TransportCause),
}

/// What happened to one request up to its response head.
pub struct Sent {
    /// Just before the first attempt was written (for schedule lag).
    pub first_t0: Instant,
    /// Just before the (last) attempt was written: the request's t0. When the attempt had
    /// to open a connection, the instant that connection was ready: connection setup is
    /// measured apart ([`Metric::Connect`](common::metrics::Metric::Connect)), not in TTFT.
    pub t0: Instant,
    /// `t0` in wall-clock time, microseconds since the Unix epoch.
    pub sent_unix_us: u64,
    /// The first attempt's t0 plus the request time limit: the end of the whole request.
    pub deadline: tokio::time::Instant,
    /// The request was sent a second time, on a fresh connection: its reused connection
    /// closed before any response byte.
    pub resent: bool,
    pub result: Result<Response, SendFailure>,
}

/// The rustls configuration for https targets: the one TLS module's
/// ([`common::tls::client_config`]: Mozilla roots plus the extra CAs, each also pinned, or no
/// verification with `insecure`; ALPN `h2` then `http/1.1`), plus what only the replay
/// measures: the handshake's start (the session store) and its version (the key log).
pub fn tls_config(transport: &TransportConfig) -> Result<rustls::ClientConfig, ClientError> {
    let trust = common::tls::Trust {
        ca: common::tls::CaPem::numbered("target CA", &transport.extra_ca_pem),
        insecure: transport.insecure,
    };
    let mut config = common::tls::client_config(&trust, common::tls::Alpn::H2ThenHttp1)?;
    // rustls's own cache (the size of its default), which also stamps handshake starts.
    config.resumption = rustls::client::Resumption::store(Arc::new(TimedSessionStore(Arc::new(
        rustls::client::ClientSessionMemoryCache::new(256),
    ))));
    config.key_log = Arc::new(VersionProbe);
    Ok(config)
}

impl TargetClient {
    /// Build the clients for `transport`.
    pub fn new(transport: &TransportConfig) -> Result<TargetClient, ClientError> {
        let tls = tls_config(transport)?;
        let connections = Arc::new(ConnectShared {
            prior_knowledge_h2: transport.h2c,
            ..ConnectShared::default()
        });
        let build = |idle_per_host: usize| {
            let mut builder = reqwest::Client::builder()
                .connector_layer(ConnectLayer {
                    shared: Arc::clone(&connections),
                    use_stash: idle_per_host > 0,
                })
                .tcp_nodelay(true)
                // A 3xx is the target's answer, counted as its status like any non-2xx (as
                // the own HTTP/1.1 client does): following it would send the request's
                // credentials (api keys, SigV4 session tokens) to another origin, perhaps
                // in cleartext.
                .redirect(reqwest::redirect::Policy::none())
                .pool_max_idle_per_host(idle_per_host)
                .pool_idle_timeout(Duration::from_secs(90))
                .tls_backend_preconfigured(tls.clone());
            if transport.h2c {
                // Cleartext HTTP/2 with prior knowledge; https negotiates by ALPN either way.
                builder = builder.http2_prior_knowledge();
            }
            builder.build().map_err(ClientError::Build)
        };
        let own_http1 = !transport.h2c && transport.sigv4.is_none() && !proxy_in_environment();
        Ok(TargetClient {
            pooled: build(4096)?,
            fresh: build(0)?,
            signer: transport.sigv4.clone(),
            connections,
            h2c: transport.h2c,
            h1: own_http1.then(Arc::default),
        })
    }

    /// The own HTTP/1.1 client's pool and `url`'s authority and request target, when that
    /// client sends to `url`: a cleartext `http://` URL without credentials, and neither
    /// HTTP/2 (`--target-h2c`), SigV4 nor a proxy (`HTTP_PROXY`, `ALL_PROXY`, which reqwest
    /// honours) asked for.
    fn own_http1<'u>(&self, url: &'u str) -> Option<(&Arc<h1::Pool>, &'u str, &'u str)> {
        let pool = self.h1.as_ref()?;
        let (authority, target) = h1::split_url(url)?;
        Some((pool, authority, target))
    }

    /// Send the timing of every connection opened from now on to `metrics`.
    pub fn attach_metrics(&self, metrics: MetricsHandle) {
        *lock(&self.connections.sink) = Some(metrics);
    }

    /// Open up to `count` connections to `url`'s origin now and keep them for the requests
    /// of the run, so that none of the first wave pays for connection setup inside its TTFT.
    /// Nothing is written on them. One connection only when it speaks HTTP/2 (every stream
    /// shares it). Each connection is given `patience`; returns how many are waiting.
    pub async fn preconnect(&self, url: &str, count: usize, patience: Duration) -> usize {
        if count == 0 {
            return self.spare_connections();
        }
        if let Some((pool, authority, _)) = self.own_http1(url) {
            let open_one = || async move {
                let connect = self.timed_connect(h1::connect(authority));
                if let Ok(Ok(conn)) = tokio::time::timeout(patience, connect).await {
                    pool.put(authority, conn);
                }
            };
            open_ahead(count, open_one, || pool.idle_count() > 0).await;
            return self.spare_connections();
        }
        let open_one = || {
            // The layer keeps the connection and fails the request before anything is
            // written: hyper sees a connect error, the target sees a connection.
            PRECONNECTING.scope((), async move {
                let _ = tokio::time::timeout(patience, self.pooled.head(url).send()).await;
            })
        };
        let more_than_one = || {
            self.spare_connections() > 0
                && !self.h2c
                && !self.connections.negotiated_h2.load(Ordering::Relaxed)
        };
        open_ahead(count, open_one, more_than_one).await;
        self.spare_connections()
    }

    /// Pre-opened connections not yet taken by a request.
    pub fn spare_connections(&self) -> usize {
        lock(&self.connections.stash).len() + self.h1.as_ref().map_or(0, |pool| pool.idle_count())
    }

    /// Send a prepared request: through the own HTTP/1.1 client when it serves `url`
    /// ([`TargetClient::own_http1`]), otherwise through reqwest. The same rules either way
    /// ([`TargetClient::send_route`]).
    pub async fn send_prepared(
        &self,
        method: http::Method,
        url: &str,
        headers: http::HeaderMap,
        body: bytes::Bytes,
        timeout: Duration,
    ) -> Sent {
        match self.own_http1(url) {
            None => {
                // Boxed: reqwest's request and builder are large, and the own HTTP/1.1
                // client's requests (every stream of a slow server waiting for its head at
                // once) would otherwise carry their space too.
                let request = self.request(method, url).headers(headers).body(body);
                Box::pin(self.send(request, timeout)).await
            }
            Some((pool, authority, target)) => {
                let head = h1::request_head(&method, authority, target, &headers, body.len());
                let route = Route::Http1(Http1Exchange {
                    pool,
                    authority,
                    method: &method,
                    head: &head,
                    body: &body,
                });
                self.send_route(&route, url, timeout).await
            }
        }
    }

    /// Start a request (headers and body are added by the caller).
    pub fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        self.pooled.request(method, url)
    }

    /// Send `request` through reqwest (signing it when asked), under the rules of
    /// [`TargetClient::send_route`].
    pub async fn send(&self, request: reqwest::RequestBuilder, timeout: Duration) -> Sent {
        let request = match request.build() {
            Ok(request) => request,
            Err(error) => {
                tracing::debug!(error = %chain(&error), "the request could not be built");
                let now = Instant::now();
                return Sent {
                    first_t0: now,
                    t0: now,
                    sent_unix_us: unix_micros(SystemTime::now()),
                    deadline: tokio::time::Instant::from_std(now + timeout),
                    resent: false,
                    result: Err(SendFailure::Transport(TransportCause::Other)),
                };
            }
        };
        let url = request.url().as_str().to_owned();
        let route = Route::Reqwest(Box::new(request));
        self.send_route(&route, &url, timeout).await
    }

    /// The rules of every send, whichever client carries it: t0 just before the write (or
    /// when a new connection the attempt had to open became ready: connection setup is
    /// measured apart, never in TTFT); one resend on a fresh connection when the attempt's
    /// connection was reused (it had carried an earlier request to its response) and closed
    /// or was reset after the write, before any response byte: the server was closing a
    /// keep-alive connection and never saw the request. On a connection opened for the
    /// request, or pre-opened for the run, the server may have seen it: no resend. The whole
    /// request, resend included, ends at the first attempt's t0 + `timeout`; every failure
    /// named by [`classify`].
    async fn send_route(&self, route: &Route<'_>, url: &str, timeout: Duration) -> Sent {
        let first_t0 = Instant::now();
        let mut sent = Sent {
            first_t0,
            t0: first_t0,
            sent_unix_us: unix_micros(SystemTime::now()),
            deadline: tokio::time::Instant::from_std(first_t0 + timeout),
            resent: false,
            result: Err(SendFailure::Transport(TransportCause::Other)),
        };
        let failure = match self.attempt(route, Connection::Any, &mut sent).await {
            Ok(response) => {
                sent.result = Ok(response);
                return sent;
            }
            Err(failure) => failure,
        };
        // Logged redacted: a target URL may carry credentials in its query.
        let url = common::recording::redact_url(url);
        let AttemptError::Failed {
            cause,
            written,
            reused,
            detail,
        } = failure
        else {
            sent.result = Err(SendFailure::Timeout);
            return sent;
        };
        if !(written && reused && resendable(cause)) {
            tracing::debug!(cause = cause.name(), error = %detail, url, "request failed before a response");
            warn_first_tls_failure(cause, &detail);
            sent.result = Err(SendFailure::Transport(cause));
            return sent;
        }
        tracing::debug!(
            cause = cause.name(),
            error = %detail,
            url,
            "reused connection closed before a response; resending once on a fresh connection"
        );
        sent.resent = true;
        sent.result = match self.attempt(route, Connection::Fresh, &mut sent).await {
            Ok(response) => Ok(response),
            Err(AttemptError::Timeout) => Err(SendFailure::Timeout),
            Err(AttemptError::Failed { cause, detail, .. }) => {
                tracing::debug!(cause = cause.name(), error = %detail, url, "request failed before a response");
                warn_first_tls_failure(cause, &detail);
                Err(SendFailure::Transport(cause))
            }
        };
        sent
    }

    /// One attempt of `route`: t0, the write, the response head, all before the deadline;
    /// t0 moves to the instant a connection the attempt had to open became ready.
    async fn attempt(
        &self,
        route: &Route<'_>,
        connection: Connection,
        sent: &mut Sent,
    ) -> Result<Response, AttemptError> {
        let ready = ConnectReady::default();
        let deadline = sent.deadline;
        // The reqwest and hyper attempts are boxed: their futures are large, and a request
        // waiting for its head (every stream of a slow server at once) holds this one.
        let work = async {
            match route {
                Route::Reqwest(request) => {
                    Box::pin(self.attempt_reqwest(request, connection, &ready, sent)).await
                }
                Route::Http1(exchange) => {
                    stamp_t0(sent);
                    self.attempt_http1(exchange, connection, &ready).await
                }
            }
        };
        let result = tokio::select! {
            result = work => result,
            _ = tokio::time::sleep_until(deadline) => Err(AttemptError::Timeout),
        };
        // The request was written once its new connection was ready: t0 moves there.
        // (Should a pooled reqwest connection free up first, hyper takes it and finishes the
        // new one in the background; this request then only moves by the part of the
        // connect that ran before its response came, which is the rare case of a race.)
        if let Some(ready) = *lock(&ready)
            && ready > sent.t0
        {
            let waited = ready - sent.t0;
            sent.t0 = ready;
            sent.sent_unix_us += waited.as_micros() as u64;
        }
        result
    }

    /// One attempt through reqwest: sign (a resend is signed anew), stamp t0, send.
    async fn attempt_reqwest(
        &self,
        request: &reqwest::Request,
        connection: Connection,
        ready: &ConnectReady,
        sent: &mut Sent,
    ) -> Result<Response, AttemptError> {
        // A bytes body always clones; should one not, nothing was written (no resend).
        let Some(mut request) = request.try_clone() else {
            return Err(AttemptError::before_write(
                TransportCause::Other,
                "the request body cannot be sent twice".into(),
            ));
        };
        if let Some(signer) = &self.signer
            && let Err(error) = signer.sign(&mut request, SystemTime::now())
        {
            // Signing only fails on a malformed URL or header; count it as a transport
            // failure of this request rather than stopping the run.
            tracing::warn!(%error, "SigV4 signing failed");
            return Err(AttemptError::before_write(
                TransportCause::Other,
                "SigV4 signing failed".into(),
            ));
        }
        let client = match connection {
            Connection::Any => &self.pooled,
            Connection::Fresh => &self.fresh,
        };
        stamp_t0(sent);
        match REQUEST_CONNECTED
            .scope(Arc::clone(ready), client.execute(request))
            .await
        {
            Ok(response) => {
                self.connections.answered(response.extensions());
                Ok(Response::Reqwest(response))
            }
            Err(error) if error.is_timeout() => Err(AttemptError::Timeout),
            Err(error) => {
                let cause = classify(&error);
                if cause == TransportCause::Tls(TlsProblem::NameMismatch) {
                    // The names the certificate holds, for the report's hint; the actor
                    // has them before the request's outcome (one channel, in order).
                    self.connections
                        .note_presented_names(common::tls::presented_names(&error))
                        .await;
                }
                Err(AttemptError::Failed {
                    cause,
                    written: !error.is_connect(),
                    reused: self.reqwest_connection_reused(&error),
                    detail: chain(&error),
                })
            }
        }
    }

    /// Whether the HTTP/1.1 connection a failed reqwest attempt went out on had carried a
    /// response before. Neither reqwest nor hyper-util says whether a request's connection
    /// was reused, but the error carries the connection's info (hyper-util's `Connected`,
    /// with its two addresses), and the connector layer keeps the connections no response
    /// came back on yet ([`ConnectShared::unanswered`]). Unknown (no connection info) is
    /// not reused; HTTP/2 never is (the rule covers HTTP/1.1 connections).
    fn reqwest_connection_reused(&self, error: &reqwest::Error) -> bool {
        if self.h2c {
            return false;
        }
        let Some(connected) = connection_info(error) else {
            return false;
        };
        !connected.is_negotiated_h2()
            && ConnectionEnds::of_connected(connected)
                .is_some_and(|ends| !self.connections.is_unanswered(ends))
    }

    /// One attempt through the own HTTP/1.1 client: a pooled connection (or a new one when
    /// `Fresh` or none waits), the write, the response head.
    async fn attempt_http1(
        &self,
        exchange: &Http1Exchange<'_>,
        connection: Connection,
        ready: &ConnectReady,
    ) -> Result<Response, AttemptError> {
        let pooled = match connection {
            Connection::Any => exchange.pool.take(exchange.authority),
            Connection::Fresh => None,
        };
        let mut conn = match pooled {
            Some(conn) => conn,
            None => {
                // Boxed: a new connection is the rare path, and its future is large.
                let conn = Box::pin(self.timed_connect(h1::connect(exchange.authority)))
                    .await
                    .map_err(|error| {
                        AttemptError::before_write(classify(&error), error.to_string())
                    })?;
                let connected = Instant::now();
                *lock(ready) = Some(connected);
                publish_t0(connected);
                conn
            }
        };
        let failed = |error: h1::H1Error, reused: bool| AttemptError::Failed {
            cause: classify(&error),
            written: true,
            reused,
            detail: error.to_string(),
        };
        if let Err(error) = conn.write_request(exchange.head, exchange.body).await {
            return Err(failed(error.into(), conn.reused_without_response()));
        }
        let head = match conn.read_head(exchange.method).await {
            Ok(head) => head,
            Err(error) => return Err(failed(error, conn.reused_without_response())),
        };
        Ok(Response::H1(h1::Response::new(
            head,
            conn,
            exchange.authority,
            Arc::clone(exchange.pool),
        )))
    }

    /// A new cleartext HTTP/1.1 connection, timed into the metrics like every other.
    async fn timed_connect<T, E>(
        &self,
        connect: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let conn = connect.await?;
        let took = started.elapsed();
        self.connections
            .record(took, None, HttpProtocol::Http1, TlsVersion::None)
            .await;
        Ok(conn)
    }
}

/// Open connections ahead of the run with `open_one` (each keeps what it opened): one first,
/// and more, up to `count` in all, only when `more_than_one` then says so (that one opened,
/// and does not carry every request by itself as an HTTP/2 connection does) — at most 64 at
/// once, as a listener's accept backlog is finite.
async fn open_ahead<F, Fut>(count: usize, open_one: F, more_than_one: impl Fn() -> bool)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use futures_util::StreamExt;
    open_one().await;
    if !more_than_one() {
        return;
    }
    futures_util::stream::iter(1..count)
        .map(|_| open_one())
        .buffer_unordered(64)
        .for_each(|()| async {})
        .await;
}

/// The request's t0 (and its wall-clock twin): now, just before the write.
fn stamp_t0(sent: &mut Sent) {
    sent.sent_unix_us = unix_micros(SystemTime::now());
    sent.t0 = Instant::now();
    publish_t0(sent.t0);
}

/// A failure cause that may be sent again, on a reused connection after the write and before
/// any byte of the response ([`TargetClient::send_route`]): the connection closed or was
/// reset. The server never answered it (a keep-alive connection it was closing), so it is
/// sent once more on a connection of its own.
fn resendable(cause: TransportCause) -> bool {
    matches!(
        cause,
        TransportCause::ClosedBeforeResponse | TransportCause::Reset
    )
}

/// One request as it goes out, the same for every attempt.
enum Route<'a> {
    /// Through reqwest (HTTPS, HTTP/2, SigV4, a proxy): a copy is sent at each attempt.
    /// Boxed, so that a route of the other clients is small.
    Reqwest(Box<reqwest::Request>),
    /// Through the own HTTP/1.1 client.
    Http1(Http1Exchange<'a>),
}

/// Which connection an attempt may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Connection {
    /// A pooled (or pre-opened) one, or a new one when none waits.
    Any,
    /// A new one, never reused (the resend).
    Fresh,
}

/// When the connection an attempt had to open became ready; `None` when it took one that
/// was open. reqwest's connector layer learns it through a task-local.
type ConnectReady = Arc<Mutex<Option<Instant>>>;

/// How one attempt failed.
enum AttemptError {
    /// The request's deadline passed first.
    Timeout,
    Failed {
        cause: TransportCause,
        /// The request was written (or being written): only then may it be resent. A
        /// failure opening the connection, or before, was never seen by the server.
        written: bool,
        /// The attempt's connection had carried an earlier request to its response (taken
        /// from the pool, not opened or pre-opened for this request), and nothing of this
        /// request's response came back that the transport can tell: only then may it be
        /// resent. An HTTP/2 connection never counts.
        reused: bool,
        /// The error and its causes, for the logs (no URL: the caller logs it redacted).
        detail: String,
    },
}

impl AttemptError {
    fn before_write(cause: TransportCause, detail: String) -> AttemptError {
        AttemptError::Failed {
            cause,
            written: false,
            reused: false,
            detail,
        }
    }
}

/// One request for the own HTTP/1.1 client: where it goes and its bytes.
struct Http1Exchange<'a> {
    pool: &'a Arc<h1::Pool>,
    authority: &'a str,
    method: &'a http::Method,
    head: &'a [u8],
    body: &'a bytes::Bytes,
}

/// A proxy reqwest would use for `http://` targets is set in the environment.
fn proxy_in_environment() -> bool {
    ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}

/// The connection side of the client: every new connection is timed (name resolution and
/// TCP connect, then the TLS handshake), and connections opened before the run wait in a
/// stash until a request needs a new one.
///
/// reqwest opens connections inside its pool and names neither the connection type nor
/// the connector's request, so this is a tower layer around its connector, generic over
/// both. The TLS handshake starts when rustls builds the ClientHello, which asks the
/// session store for a key-exchange hint: [`TimedSessionStore`] stamps that instant into
/// the connect future's task-local.
#[derive(Clone)]
struct ConnectLayer {
    shared: Arc<ConnectShared>,
    /// Only the pooled client takes pre-opened connections; the fresh one (resends) never.
    use_stash: bool,
}

/// What the connector layers of one client share.
#[derive(Default)]
struct ConnectShared {
    /// Pre-opened connections (reqwest's private connection type, boxed as `Any`).
    stash: Mutex<Vec<Box<dyn Any + Send>>>,
    /// Where each connection's timing goes (the run's metrics actor).
    sink: Mutex<Option<MetricsHandle>>,
    /// The last pre-opened connection negotiated HTTP/2: one connection carries every stream.
    negotiated_h2: AtomicBool,
    /// `--target-h2c`: HTTP/2 with prior knowledge, whatever ALPN says.
    prior_knowledge_h2: bool,
    /// The connections opened (for a request, or ahead of the run) that no response has
    /// come back on yet: a request that fails on one of them is not resent (the server may
    /// have read it). Entries of connections that closed unanswered stay until a new
    /// connection has the same two addresses: at most one per local port and target address.
    unanswered: Mutex<HashSet<ConnectionEnds>>,
}

/// One TCP connection by its two addresses, from hyper-util's `HttpInfo` (reqwest's
/// connections carry it, under TLS too): what names a connection in both a failed request's
/// error and a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ConnectionEnds {
    local: SocketAddr,
    remote: SocketAddr,
}

impl ConnectionEnds {
    fn of_info(info: &HttpInfo) -> ConnectionEnds {
        ConnectionEnds {
            local: info.local_addr(),
            remote: info.remote_addr(),
        }
    }

    fn of_connected(connected: &Connected) -> Option<ConnectionEnds> {
        let mut extensions = http::Extensions::new();
        connected.get_extras(&mut extensions);
        extensions.get::<HttpInfo>().map(ConnectionEnds::of_info)
    }
}

/// The info of the connection a failed reqwest request went out on: hyper-util's error,
/// somewhere in reqwest's chain, carries it once a connection was taken.
fn connection_info(error: &reqwest::Error) -> Option<&Connected> {
    let mut current = error.source();
    while let Some(error) = current {
        if let Some(legacy) = error.downcast_ref::<hyper_util::client::legacy::Error>() {
            return legacy.connect_info();
        }
        current = error.source();
    }
    None
}

tokio::task_local! {
    /// Set while [`TargetClient::preconnect`] opens a connection: the layer keeps it.
    static PRECONNECTING: ();
    /// Set while a request is sent: the instant its connection became ready, when the
    /// request had to wait for a new one (t0 then moves to it: the request is written after).
    static REQUEST_CONNECTED: Arc<Mutex<Option<Instant>>>;
    /// Set while a request that may be cancelled is sent: told the request's t0 as soon as
    /// it is known (stamped before the write, moved to a new connection's ready instant), so
    /// the cancel point counts from it before the response head arrives.
    static T0_PROBE: T0Probe;
    /// Set while a connection is being opened: when its TLS handshake started, and the
    /// TLS version it negotiated.
    static TLS_STARTED: Arc<Mutex<Handshake>>;
}

/// Where a request's t0 is published while it is sent ([`TargetClient::with_t0_probe`]):
/// the latest value is the t0 (a resend or a new connection moves it later).
pub type T0Probe = tokio::sync::watch::Sender<Option<Instant>>;

impl TargetClient {
    /// Run `send` (a [`TargetClient::send_prepared`]) with `probe` told the request's t0 as
    /// soon as it is known, before the response head: a cancel point counts from it.
    pub async fn with_t0_probe<F: std::future::Future>(probe: T0Probe, send: F) -> F::Output {
        T0_PROBE.scope(probe, send).await
    }
}

/// Tell the request's probe (when it has one) its t0 moved to `at`.
fn publish_t0(at: Instant) {
    let _ = T0_PROBE.try_with(|probe| probe.send_replace(Some(at)));
}

/// The connector service of [`ConnectLayer`].
#[derive(Clone)]
struct ConnectService<S> {
    inner: S,
    shared: Arc<ConnectShared>,
    use_stash: bool,
}

impl<S> tower_layer::Layer<S> for ConnectLayer {
    type Service = ConnectService<S>;

    fn layer(&self, inner: S) -> ConnectService<S> {
        ConnectService {
            inner,
            shared: Arc::clone(&self.shared),
            use_stash: self.use_stash,
        }
    }
}

type BoxError = Box<dyn StdError + Send + Sync>;

/// Why a pre-opening "request" ends without being sent: its connection was kept instead.
#[derive(Debug, thiserror::Error)]
#[error("connection pre-opened for the run")]
struct Preconnected;

impl<S, R> tower_service::Service<R> for ConnectService<S>
where
    S: tower_service::Service<R, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response:
        hyper::rt::Read + hyper_util::client::legacy::connect::Connection + Unpin + Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<S::Response, BoxError>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let preconnecting = PRECONNECTING.try_with(|()| ()).is_ok();
        let waiting_request = REQUEST_CONNECTED.try_with(Arc::clone).ok();
        let probe = T0_PROBE.try_with(Clone::clone).ok();
        if self.use_stash && !preconnecting {
            while let Some(mut conn) = self.shared.take_stashed::<S::Response>() {
                if still_open(&mut conn) {
                    let connected = Instant::now();
                    if let Some(cell) = waiting_request {
                        *lock(&cell) = Some(connected);
                    }
                    if let Some(probe) = &probe {
                        probe.send_replace(Some(connected));
                    }
                    return Box::pin(std::future::ready(Ok(conn)));
                }
            }
        }
        // The usual tower dance: call the clone that was made ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let tls_started = Arc::new(Mutex::new(Handshake::default()));
        let started = Instant::now();
        let connecting = TLS_STARTED.scope(Arc::clone(&tls_started), inner.call(request));
        Box::pin(async move {
            let conn = connecting.await?;
            let ready = Instant::now();
            let handshake = *lock(&tls_started);
            let tls = handshake.started;
            let connect = tls.unwrap_or(ready).saturating_duration_since(started);
            let handshake_took = tls.map(|t| ready.saturating_duration_since(t));
            let connected = hyper_util::client::legacy::connect::Connection::connected(&conn);
            shared.opened(&connected);
            let h2 = connected.is_negotiated_h2();
            let version = match (tls, handshake.version) {
                (None, _) => TlsVersion::None,
                (Some(_), Some(version)) => version,
                (Some(_), None) => TlsVersion::Unknown,
            };
            let protocol = match (h2 || shared.prior_knowledge_h2, version) {
                (false, _) => HttpProtocol::Http1,
                (true, TlsVersion::None) => HttpProtocol::H2c,
                (true, _) => HttpProtocol::H2,
            };
            shared
                .record(connect, handshake_took, protocol, version)
                .await;
            if preconnecting {
                shared.negotiated_h2.store(h2, Ordering::Relaxed);
                lock(&shared.stash).push(Box::new(conn));
                return Err(Box::new(Preconnected) as BoxError);
            }
            let connected = Instant::now();
            if let Some(cell) = waiting_request {
                *lock(&cell) = Some(connected);
            }
            if let Some(probe) = &probe {
                probe.send_replace(Some(connected));
            }
            Ok(conn)
        })
    }
}

impl ConnectShared {
    /// A new connection: no response has come back on it yet.
    fn opened(&self, connected: &Connected) {
        if let Some(ends) = ConnectionEnds::of_connected(connected) {
            lock(&self.unanswered).insert(ends);
        }
    }

    /// A response head came back on the connection `extensions` (a response's) name.
    fn answered(&self, extensions: &http::Extensions) {
        if let Some(info) = extensions.get::<HttpInfo>() {
            lock(&self.unanswered).remove(&ConnectionEnds::of_info(info));
        }
    }

    /// No response has come back on the connection `ends` names since it was opened.
    fn is_unanswered(&self, ends: ConnectionEnds) -> bool {
        lock(&self.unanswered).contains(&ends)
    }

    /// Time one new connection into the run's metrics: its setup (name resolution and TCP
    /// connect) and its TLS handshake, by protocol and TLS version.
    async fn record(
        &self,
        connect: Duration,
        tls: Option<Duration>,
        protocol: HttpProtocol,
        version: TlsVersion,
    ) {
        let sink = lock(&self.sink).clone();
        if let Some(sink) = sink {
            sink.record_connection(
                connect.as_micros() as u64,
                tls.map(|t| t.as_micros() as u64),
                protocol,
                version,
            )
            .await;
        }
    }

    /// Tell the metrics the names a certificate refused for its name holds
    /// ([`MetricsHandle::presented_names`]).
    async fn note_presented_names(&self, names: Option<String>) {
        let sink = lock(&self.sink).clone();
        if let (Some(sink), Some(names)) = (sink, names) {
            sink.presented_names(names).await;
        }
    }

    fn take_stashed<C: 'static>(&self) -> Option<C> {
        let conn = lock(&self.stash).pop()?;
        // The stash only ever holds this connector's connections.
        conn.downcast::<C>().ok().map(|conn| *conn)
    }
}

/// A pre-opened connection is still usable when a read would wait: the server closed it
/// (idle timeout) when it reads the end, and nothing is expected before a request.
fn still_open<C: hyper::rt::Read + Unpin>(conn: &mut C) -> bool {
    let mut storage = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    let mut buf = hyper::rt::ReadBuf::uninit(&mut storage);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    // Ready means the end (or bytes nobody asked for): either way, not a fresh connection.
    std::pin::Pin::new(conn)
        .poll_read(&mut cx, buf.unfilled())
        .is_pending()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain values: consistent even if a holder panicked.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The session store of the target's TLS configuration: rustls's own in-memory cache,
/// plus the instant each handshake starts (rustls asks for a key-exchange hint, or a
/// session to resume, when it builds the ClientHello).
#[derive(Debug)]
struct TimedSessionStore(Arc<dyn rustls::client::ClientSessionStore>);

fn handshake_starts() {
    let _ = TLS_STARTED.try_with(|cell| {
        lock(cell).started.get_or_insert_with(Instant::now);
    });
}

/// What the client saw of one connection's TLS handshake.
#[derive(Debug, Clone, Copy, Default)]
struct Handshake {
    /// When it started (rustls built the ClientHello); `None` on a cleartext connection.
    started: Option<Instant>,
    /// The version it negotiated, once known.
    version: Option<TlsVersion>,
}

/// Learns each handshake's TLS version from the names of the secrets rustls derives (TLS
/// 1.3's handshake traffic secrets, TLS 1.2's `CLIENT_RANDOM` master secret), the one hook
/// rustls offers inside reqwest's connector: reqwest hides the TLS stream, whose
/// `protocol_version()` would say it. It keeps no secret: TLS 1.3's are declined
/// (`will_log` is false) and TLS 1.2's, which rustls hands over without asking, are dropped.
#[derive(Debug)]
struct VersionProbe;

impl VersionProbe {
    fn note(label: &str) {
        let version = match label {
            "CLIENT_RANDOM" => TlsVersion::Tls12,
            "CLIENT_HANDSHAKE_TRAFFIC_SECRET"
            | "SERVER_HANDSHAKE_TRAFFIC_SECRET"
            | "CLIENT_TRAFFIC_SECRET_0"
            | "SERVER_TRAFFIC_SECRET_0"
            | "EXPORTER_SECRET"
            | "CLIENT_EARLY_TRAFFIC_SECRET" => TlsVersion::Tls13,
            _ => return,
        };
        let _ = TLS_STARTED.try_with(|cell| {
            lock(cell).version.get_or_insert(version);
        });
    }
}

impl rustls::KeyLog for VersionProbe {
    fn log(&self, label: &str, _client_random: &[u8], _secret: &[u8]) {
        VersionProbe::note(label);
    }

    fn will_log(&self, label: &str) -> bool {
        VersionProbe::note(label);
        false
    }
}

impl rustls::client::ClientSessionStore for TimedSessionStore {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: rustls::NamedGroup) {
        self.0.set_kx_hint(server_name, group);
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        handshake_starts();
        self.0.kx_hint(server_name)
    }

    fn set_tls12_session(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.0.set_tls12_session(server_name, value);
    }

    fn tls12_session(
        &self,
        server_name: &ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        handshake_starts();
        self.0.tls12_session(server_name)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.0.remove_tls12_session(server_name);
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.0.insert_tls13_ticket(server_name, value);
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        handshake_starts();
        self.0.take_tls13_ticket(server_name)
    }
}

/// The cause of a transport failure: [`common::transport::classify`], the classification
/// the recording proxy shares, plus what only this client's errors say. A [`BodyError`]
/// came after a response head: whatever ended the body (a close, a reset, an HTTP/2
/// `RST_STREAM`), the cause is [`TransportCause::ClosedAfterHead`], the same on either client
/// and protocol. The own HTTP/1.1 client's [`h1::H1Error::Http2Answer`] (an HTTP/1.1 request
/// answered with HTTP/2 frames) is [`TransportCause::Http2Only`], as hyper's parse error of
/// the same is.
pub fn classify(error: &(dyn StdError + 'static)) -> TransportCause {
    if error.downcast_ref::<BodyError>().is_some() {
        return TransportCause::ClosedAfterHead;
    }
    if let Some(h1::H1Error::Http2Answer) = error.downcast_ref::<h1::H1Error>() {
        return TransportCause::Http2Only;
    }
    common::transport::classify(error).transport()
}

/// `outer: inner: innermost`, for logs, without the URL reqwest puts in its own message
/// (the caller logs it redacted).
fn chain(error: &reqwest::Error) -> String {
    let mut text = String::from(if error.is_connect() {
        "connect"
    } else if error.is_builder() {
        "building the request"
    } else {
        "request"
    });
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

fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The worker's first TLS failure, logged as a warning with rustls's own words (an expired
/// certificate's dates, the names a certificate holds), once per process: the report counts
/// TLS failures by problem only, and every later one is counted there, not logged.
fn warn_first_tls_failure(cause: TransportCause, detail: &str) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if let TransportCause::Tls(problem) = cause
        && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        tracing::warn!(
            problem = problem.description(),
            error = %detail,
            "TLS with the target failed (later TLS failures are counted in the report, not logged)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_port_is_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let client = TargetClient::new(&TransportConfig::default()).expect("client");
        let sent = client
            .send(
                client.request(reqwest::Method::GET, &format!("http://{addr}/")),
                Duration::from_secs(5),
            )
            .await;
        assert_eq!(
            sent.result.err(),
            Some(SendFailure::Transport(TransportCause::Refused))
        );
        assert!(!sent.resent);
    }

    #[tokio::test]
    async fn a_redirect_is_a_status_and_is_not_followed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Elsewhere: another origin, which counts every connection it gets.
        let elsewhere = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let elsewhere_addr = elsewhere.local_addr().expect("addr");
        let reached = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&reached);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = elsewhere.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            }
        });
        // The target: 307 to the other origin, for every request.
        let target = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let target_addr = target.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = target.accept().await {
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let response = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://{elsewhere_addr}/v1/chat/completions\r\ncontent-length: 0\r\n\r\n"
                );
                let _ = socket.write_all(response.as_bytes()).await;
            }
        });
        let client = TargetClient::new(&TransportConfig::default()).expect("client");
        let sent = client
            .send(
                client
                    .request(reqwest::Method::POST, &format!("http://{target_addr}/"))
                    .header("x-api-key", "secret")
                    .body("{}"),
                Duration::from_secs(5),
            )
            .await;
        let status = sent.result.map(|response| response.status().as_u16());
        assert!(matches!(status, Ok(307)), "{status:?}");
        assert_eq!(
            reached.load(Ordering::SeqCst),
            0,
            "the redirect was followed"
        );
    }

    /// What a test server does with each request on a connection.
    #[derive(Clone, Copy)]
    enum Reply {
        /// A whole `200` with a 2-byte body, the connection kept alive.
        Answer,
        /// Close the connection without a byte of response.
        Close,
        /// Part of a response head, then close.
        HalfHeadThenClose,
    }

    /// A server on 127.0.0.1:0 that treats the n-th request on each connection as
    /// `replies[n]` (the last one for every later request); returns its URL and the bodies
    /// of the requests it read, in order.
    async fn scripted_server(replies: &'static [Reply]) -> (String, Arc<Mutex<Vec<String>>>) {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    for n in 0.. {
                        let Some(body) = read_request(&mut socket).await else {
                            return;
                        };
                        lock(&log).push(body);
                        let reply = replies[n.min(replies.len() - 1)];
                        let written = match reply {
                            Reply::Answer => {
                                socket
                                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                                    .await
                            }
                            Reply::Close => return,
                            Reply::HalfHeadThenClose => {
                                let _ = socket.write_all(b"HTTP/1.1 200 OK\r\n").await;
                                return;
                            }
                        };
                        if written.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, seen)
    }

    /// One request's body (head up to the blank line, `content-length` bytes of body), or
    /// `None` when the peer closed first.
    async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<String> {
        use tokio::io::AsyncReadExt;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        Some(String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned())
    }

    /// Send `body` to `url` through the own HTTP/1.1 client, or through reqwest.
    async fn post(client: &TargetClient, url: &str, body: &'static str, own_http1: bool) -> Sent {
        let timeout = Duration::from_secs(5);
        if own_http1 {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::CONTENT_TYPE,
                "application/json".parse().expect("value"),
            );
            client
                .send_prepared(
                    http::Method::POST,
                    url,
                    headers,
                    bytes::Bytes::from(body),
                    timeout,
                )
                .await
        } else {
            client
                .send(
                    client.request(reqwest::Method::POST, url).body(body),
                    timeout,
                )
                .await
        }
    }

    /// Read `sent`'s whole response, so that its connection goes back to the pool.
    async fn read_body(sent: Sent) {
        let Ok(mut response) = sent.result else {
            panic!("no response: {:?}", sent.result.err());
        };
        while let Some(_bytes) = response.chunk().await.expect("the body") {}
    }

    fn failure(sent: &Sent) -> Option<SendFailure> {
        sent.result.as_ref().err().copied()
    }

    /// The server read the request on the connection opened for it and closed: it may have
    /// acted on it, so the request fails with its cause and is not sent again (either
    /// transport).
    #[tokio::test]
    async fn a_request_whose_new_connection_closes_after_the_write_is_not_resent() {
        for own_http1 in [true, false] {
            let (url, seen) = scripted_server(&[Reply::Close]).await;
            let client = TargetClient::new(&TransportConfig::default()).expect("client");
            let sent = post(&client, &url, "one", own_http1).await;
            assert_eq!(
                failure(&sent),
                Some(SendFailure::Transport(TransportCause::ClosedBeforeResponse)),
                "own_http1 {own_http1}"
            );
            assert!(!sent.resent, "own_http1 {own_http1}");
            assert_eq!(*lock(&seen), ["one"], "own_http1 {own_http1}");
        }
    }

    /// A connection opened before the run carried no request: the server has answered
    /// nothing on it, and a close after the write is not resent either. (An `http://`
    /// target's connections are pre-opened for the own HTTP/1.1 client; reqwest's, for
    /// `https://`, in `tests/tests/resend_rule.rs`.)
    #[tokio::test]
    async fn a_request_whose_pre_opened_connection_closes_after_the_write_is_not_resent() {
        let (url, seen) = scripted_server(&[Reply::Close]).await;
        let client = TargetClient::new(&TransportConfig::default()).expect("client");
        assert_eq!(client.preconnect(&url, 1, Duration::from_secs(5)).await, 1);
        let sent = post(&client, &url, "one", true).await;
        assert_eq!(
            client.spare_connections(),
            0,
            "the pre-opened one was taken"
        );
        assert_eq!(
            failure(&sent),
            Some(SendFailure::Transport(TransportCause::ClosedBeforeResponse))
        );
        assert!(!sent.resent);
        assert_eq!(*lock(&seen), ["one"]);
    }

    /// A keep-alive connection that answered one request closes when the next arrives,
    /// without a byte: the server did not take it, and it is sent once more on a new
    /// connection, which answers (either transport).
    #[tokio::test]
    async fn a_request_whose_reused_connection_closes_before_any_byte_is_resent_once() {
        for own_http1 in [true, false] {
            let (url, seen) = scripted_server(&[Reply::Answer, Reply::Close]).await;
            let client = TargetClient::new(&TransportConfig::default()).expect("client");
            let first = post(&client, &url, "one", own_http1).await;
            assert!(!first.resent);
            read_body(first).await;
            let second = post(&client, &url, "two", own_http1).await;
            assert_eq!(
                second.result.as_ref().map(Response::status).ok(),
                Some(http::StatusCode::OK),
                "own_http1 {own_http1}: {:?}",
                failure(&second)
            );
            assert!(second.resent, "own_http1 {own_http1}");
            assert!(second.first_t0 < second.t0, "t0 is the resend's");
            assert_eq!(*lock(&seen), ["one", "two", "two"], "own_http1 {own_http1}");
        }
    }

    /// Part of a response head came back before the reused connection closed: the server
    /// took the request, and it is not sent again (the own HTTP/1.1 client sees the bytes).
    #[tokio::test]
    async fn a_reused_connection_closed_inside_the_response_head_is_not_resent() {
        let (url, seen) = scripted_server(&[Reply::Answer, Reply::HalfHeadThenClose]).await;
        let client = TargetClient::new(&TransportConfig::default()).expect("client");
        read_body(post(&client, &url, "one", true).await).await;
        let second = post(&client, &url, "two", true).await;
        assert!(
            matches!(failure(&second), Some(SendFailure::Transport(_))),
            "{:?}",
            failure(&second)
        );
        assert!(!second.resent);
        assert_eq!(*lock(&seen), ["one", "two"]);
    }

    #[test]
    fn a_ca_without_certificates_is_refused() {
        let transport = TransportConfig {
            extra_ca_pem: vec!["not a certificate".into()],
            ..TransportConfig::default()
        };
        let error = tls_config(&transport).expect_err("refused");
        assert!(
            matches!(
                &error,
                ClientError::Tls(common::tls::TlsError::CaEmpty { source_name })
                    if source_name == "target CA #0"
            ),
            "{error:?}"
        );
    }

    #[test]
    fn rustls_errors_inside_io_errors_are_found() {
        use common::measure::TlsProblem;
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(
            classify(&io),
            TransportCause::Tls(TlsProblem::UnknownIssuer)
        );
        // As hyper-rustls wraps it: an I/O error holding rustls's I/O error.
        let wrapped = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName),
        ));
        assert_eq!(
            classify(&wrapped),
            TransportCause::Tls(TlsProblem::NameMismatch)
        );
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(classify(&reset), TransportCause::Reset);
    }
}
