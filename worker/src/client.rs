//! The HTTP client of the replay: TLS trust (Mozilla roots, `--target-ca`, `--insecure`),
//! HTTP/2 by ALPN or prior knowledge (`--target-h2c`), SigV4 signing, one resend on a fresh
//! connection when a reused connection closed before any response byte, and the cause of
//! every transport failure.
//!
//! Servers such as llama.cpp close a keep-alive connection after each streamed response
//! without saying `Connection: close`; the next request written on that pooled connection
//! then fails before any response byte. Such a request never reached the model, so it is
//! sent once more on a connection of its own, and counted as resent.

use std::any::Any;
use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::measure::{TlsProblem, TransportCause};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use crate::config::TransportConfig;
use crate::metrics_actor::MetricsHandle;

/// Why the HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("target CA #{index}: not a PEM certificate: {source}")]
    CaPem {
        index: usize,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("target CA #{index}: holds no certificate")]
    CaEmpty { index: usize },
    #[error("target CA #{index}: {source}")]
    CaRejected {
        index: usize,
        #[source]
        source: rustls::Error,
    },
    #[error("TLS configuration: {0}")]
    Tls(#[source] rustls::Error),
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
    /// The request was sent a second time, on a fresh connection.
    pub resent: bool,
    pub result: Result<reqwest::Response, SendFailure>,
}

/// The rustls configuration for https targets: Mozilla roots plus the extra CAs (or no
/// verification at all with `insecure`), ring, ALPN `h2` then `http/1.1`.
pub fn tls_config(transport: &TransportConfig) -> Result<rustls::ClientConfig, ClientError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(ClientError::Tls)?;
    let mut config = if transport.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        for (index, pem) in transport.extra_ca_pem.iter().enumerate() {
            let mut any = false;
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|source| ClientError::CaPem { index, source })?;
                roots
                    .add(cert)
                    .map_err(|source| ClientError::CaRejected { index, source })?;
                any = true;
            }
            if !any {
                return Err(ClientError::CaEmpty { index });
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // rustls's own cache (the size of its default), which also stamps handshake starts.
    config.resumption = rustls::client::Resumption::store(Arc::new(TimedSessionStore(Arc::new(
        rustls::client::ClientSessionMemoryCache::new(256),
    ))));
    Ok(config)
}

impl TargetClient {
    /// Build the clients for `transport`.
    pub fn new(transport: &TransportConfig) -> Result<TargetClient, ClientError> {
        let tls = tls_config(transport)?;
        let connections = Arc::new(ConnectShared::default());
        let build = |idle_per_host: usize| {
            let mut builder = reqwest::Client::builder()
                .connector_layer(ConnectLayer {
                    shared: Arc::clone(&connections),
                    use_stash: idle_per_host > 0,
                })
                .tcp_nodelay(true)
                .pool_max_idle_per_host(idle_per_host)
                .pool_idle_timeout(Duration::from_secs(90))
                .tls_backend_preconfigured(tls.clone());
            if transport.h2c {
                // Cleartext HTTP/2 with prior knowledge; https negotiates by ALPN either way.
                builder = builder.http2_prior_knowledge();
            }
            builder.build().map_err(ClientError::Build)
        };
        Ok(TargetClient {
            pooled: build(4096)?,
            fresh: build(0)?,
            signer: transport.sigv4.clone(),
            connections,
            h2c: transport.h2c,
        })
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
        use futures_util::StreamExt;
        if count == 0 {
            return self.spare_connections();
        }
        let open_one = || {
            // The layer keeps the connection and fails the request before anything is
            // written: hyper sees a connect error, the target sees a connection.
            PRECONNECTING.scope((), async move {
                let _ = tokio::time::timeout(patience, self.pooled.head(url).send()).await;
            })
        };
        open_one().await;
        if self.spare_connections() == 0
            || self.h2c
            || self.connections.negotiated_h2.load(Ordering::Relaxed)
        {
            return self.spare_connections();
        }
        // Not all at once: a listener's accept backlog is finite.
        futures_util::stream::iter(1..count)
            .map(|_| open_one())
            .buffer_unordered(64)
            .for_each(|()| async {})
            .await;
        self.spare_connections()
    }

    /// Pre-opened connections not yet taken by a request.
    pub fn spare_connections(&self) -> usize {
        lock(&self.connections.stash).len()
    }

    /// Start a request (headers and body are added by the caller).
    pub fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        self.pooled.request(method, url)
    }

    /// Send `request` (signing it when asked), resending it once on a fresh connection when
    /// the first attempt failed on its connection before any response byte. The whole
    /// request, resend included, ends at the first attempt's t0 + `timeout`.
    pub async fn send(&self, request: reqwest::RequestBuilder, timeout: Duration) -> Sent {
        let first_t0 = Instant::now();
        let deadline = tokio::time::Instant::from_std(first_t0 + timeout);
        let mut sent = Sent {
            first_t0,
            t0: first_t0,
            sent_unix_us: unix_micros(SystemTime::now()),
            deadline,
            resent: false,
            result: Err(SendFailure::Transport(TransportCause::Other)),
        };
        let request = match request.build() {
            Ok(request) => request,
            Err(error) => {
                tracing::debug!(error = %chain(&error), "the request could not be built");
                return sent;
            }
        };
        let spare = request.try_clone();
        // Logged redacted: a target URL may carry credentials in its query.
        let url = common::recording::redact_url(request.url().as_str());
        let error = match self.attempt(&self.pooled, request, &mut sent).await {
            Ok(response) => {
                sent.result = Ok(response);
                return sent;
            }
            Err(AttemptError::Timeout) => {
                sent.result = Err(SendFailure::Timeout);
                return sent;
            }
            Err(AttemptError::Unsigned) => return sent,
            Err(AttemptError::Http(error)) => error,
        };
        let cause = classify(&error);
        match spare {
            Some(spare) if resendable(&error, cause) => {
                tracing::debug!(
                    cause = cause.name(),
                    error = %chain(&error),
                    url,
                    "connection closed before a response; resending once on a fresh connection"
                );
                sent.resent = true;
                sent.result = match self.attempt(&self.fresh, spare, &mut sent).await {
                    Ok(response) => Ok(response),
                    Err(AttemptError::Timeout) => Err(SendFailure::Timeout),
                    Err(AttemptError::Unsigned) => {
                        Err(SendFailure::Transport(TransportCause::Other))
                    }
                    Err(AttemptError::Http(error)) => Err(failure(&error, &url)),
                };
            }
            _ => sent.result = Err(failure(&error, &url)),
        }
        sent
    }

    /// One attempt: sign, stamp t0, send until the deadline.
    async fn attempt(
        &self,
        client: &reqwest::Client,
        mut request: reqwest::Request,
        sent: &mut Sent,
    ) -> Result<reqwest::Response, AttemptError> {
        if let Some(signer) = &self.signer
            && let Err(error) = signer.sign(&mut request, SystemTime::now())
        {
            // Signing only fails on a malformed URL or header; count it as a transport
            // failure of this request rather than stopping the run.
            tracing::warn!(%error, "SigV4 signing failed");
            return Err(AttemptError::Unsigned);
        }
        let connected = Arc::new(Mutex::new(None));
        sent.sent_unix_us = unix_micros(SystemTime::now());
        sent.t0 = Instant::now();
        let result = tokio::select! {
            response = REQUEST_CONNECTED.scope(Arc::clone(&connected), client.execute(request)) => {
                response.map_err(AttemptError::Http)
            }
            _ = tokio::time::sleep_until(sent.deadline) => Err(AttemptError::Timeout),
        };
        // The request was written once its new connection was ready: t0 moves there.
        // (Should a pooled connection free up first, hyper takes it and finishes the new one
        // in the background; this request then only moves by the part of the connect that
        // ran before its response came, which is the rare case of a race.)
        let ready = *lock(&connected);
        if let Some(ready) = ready
            && ready > sent.t0
        {
            let waited = ready - sent.t0;
            sent.t0 = ready;
            sent.sent_unix_us += waited.as_micros() as u64;
        }
        result
    }
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
}

tokio::task_local! {
    /// Set while [`TargetClient::preconnect`] opens a connection: the layer keeps it.
    static PRECONNECTING: ();
    /// Set while a request is sent: the instant its connection became ready, when the
    /// request had to wait for a new one (t0 then moves to it: the request is written after).
    static REQUEST_CONNECTED: Arc<Mutex<Option<Instant>>>;
    /// Set while a connection is being opened: when its TLS handshake started.
    static TLS_STARTED: Arc<Mutex<Option<Instant>>>;
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
        if self.use_stash && !preconnecting {
            while let Some(mut conn) = self.shared.take_stashed::<S::Response>() {
                if still_open(&mut conn) {
                    if let Some(cell) = waiting_request {
                        *lock(&cell) = Some(Instant::now());
                    }
                    return Box::pin(std::future::ready(Ok(conn)));
                }
            }
        }
        // The usual tower dance: call the clone that was made ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let tls_started = Arc::new(Mutex::new(None));
        let started = Instant::now();
        let connecting = TLS_STARTED.scope(Arc::clone(&tls_started), inner.call(request));
        Box::pin(async move {
            let conn = connecting.await?;
            let ready = Instant::now();
            let tls = *lock(&tls_started);
            let connect_us = tls.unwrap_or(ready).saturating_duration_since(started);
            let tls_us = tls.map(|t| ready.saturating_duration_since(t).as_micros() as u64);
            let sink = lock(&shared.sink).clone();
            if let Some(sink) = sink {
                sink.record_connection(connect_us.as_micros() as u64, tls_us)
                    .await;
            }
            if preconnecting {
                let h2 = hyper_util::client::legacy::connect::Connection::connected(&conn)
                    .is_negotiated_h2();
                shared.negotiated_h2.store(h2, Ordering::Relaxed);
                lock(&shared.stash).push(Box::new(conn));
                return Err(Box::new(Preconnected) as BoxError);
            }
            if let Some(cell) = waiting_request {
                *lock(&cell) = Some(Instant::now());
            }
            Ok(conn)
        })
    }
}

impl ConnectShared {
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
        lock(cell).get_or_insert_with(Instant::now);
    });
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

/// How one attempt failed.
enum AttemptError {
    Timeout,
    /// Signing failed (a malformed URL or header): a transport failure of this request.
    Unsigned,
    Http(reqwest::Error),
}

fn failure(error: &reqwest::Error, url: &str) -> SendFailure {
    if error.is_timeout() {
        return SendFailure::Timeout;
    }
    let cause = classify(error);
    tracing::debug!(cause = cause.name(), error = %chain(error), url, "request failed before a response");
    SendFailure::Transport(cause)
}

/// A request that failed this way never got a byte of response on a connection that was
/// open: it is safe to send again, once.
fn resendable(error: &reqwest::Error, cause: TransportCause) -> bool {
    !error.is_connect()
        && matches!(
            cause,
            TransportCause::ClosedBeforeResponse | TransportCause::Reset
        )
}

/// The cause of a transport failure, from the error's source chain (rustls, I/O and hyper
/// errors are recognised; DNS failures by their message, as the resolver's type is private).
pub fn classify(error: &(dyn StdError + 'static)) -> TransportCause {
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    let mut fallback = TransportCause::Other;
    while let Some(e) = current {
        // An I/O error's `source()` skips its own payload, where rustls (and connectors
        // wrapping rustls's I/O error in another) put theirs: walk into the payload instead.
        let mut next = e.source();
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return TransportCause::Tls(tls_problem(tls));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return TransportCause::Refused,
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe => return TransportCause::Reset,
                std::io::ErrorKind::UnexpectedEof => {
                    fallback = TransportCause::ClosedBeforeResponse
                }
                _ => {}
            }
            if let Some(payload) = io.get_ref() {
                next = Some(payload as &(dyn StdError + 'static));
            }
        }
        if let Some(hyper) = e.downcast_ref::<hyper::Error>()
            && (hyper.is_incomplete_message() || hyper.is_canceled() || hyper.is_closed())
        {
            fallback = TransportCause::ClosedBeforeResponse;
        }
        let text = e.to_string();
        if text.starts_with("dns error") || text.contains("failed to lookup address") {
            return TransportCause::Dns;
        }
        current = next;
    }
    fallback
}

fn tls_problem(error: &rustls::Error) -> TlsProblem {
    use rustls::CertificateError as C;
    match error {
        rustls::Error::InvalidCertificate(certificate) => match certificate {
            C::UnknownIssuer => TlsProblem::UnknownIssuer,
            C::NotValidForName | C::NotValidForNameContext { .. } => TlsProblem::NameMismatch,
            C::Expired | C::ExpiredContext { .. } => TlsProblem::Expired,
            C::NotValidYet | C::NotValidYetContext { .. } => TlsProblem::NotYetValid,
            C::Revoked => TlsProblem::Revoked,
            C::BadSignature => TlsProblem::BadSignature,
            _ => TlsProblem::Other,
        },
        rustls::Error::AlertReceived(_)
        | rustls::Error::InvalidMessage(_)
        | rustls::Error::PeerIncompatible(_)
        | rustls::Error::PeerMisbehaved(_)
        | rustls::Error::NoApplicationProtocol => TlsProblem::Handshake,
        _ => TlsProblem::Other,
    }
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

/// `--insecure`: accept any certificate, but still check the handshake signatures so the
/// connection is at least consistent with the certificate presented.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
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

    #[test]
    fn a_ca_without_certificates_is_refused() {
        let transport = TransportConfig {
            extra_ca_pem: vec!["not a certificate".into()],
            ..TransportConfig::default()
        };
        assert!(matches!(
            tls_config(&transport),
            Err(ClientError::CaEmpty { index: 0 })
        ));
    }

    #[test]
    fn rustls_errors_inside_io_errors_are_found() {
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
